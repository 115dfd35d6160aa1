// swift-tools-version:6.0
// ModuleKit: the SDK every plugin and the host share. It is a package of its own so
// that SwiftPM links it as one dynamic library (libModuleKit.so) that exists once per
// process: two copies of its types in one process would be two different types, and a
// module of one would not be a module to the other (docs/abi.md).
import PackageDescription

let package = Package(
    name: "ModuleKit",
    products: [
        .library(name: "ModuleKit", type: .dynamic, targets: ["ModuleKit"]),
    ],
    targets: [
        // The C ABI: the contract for plugins written in plain C.
        .target(name: "CModuleHost"),
        // Built with library evolution, so that a plugin compiled against one ModuleKit
        // keeps working with a later compatible one (docs/abi.md, "Swift plugin
        // compatibility"), and with a textual interface (.swiftinterface) installed next to
        // the binary module. The -I lets the interface's verification find CModuleHost.
        .target(
            name: "ModuleKit",
            dependencies: ["CModuleHost"],
            swiftSettings: [
                .swiftLanguageMode(.v6),
                .unsafeFlags(["-enable-library-evolution", "-emit-module-interface",
                              "-I", Context.packageDirectory + "/Sources/CModuleHost/include"]),
            ]
        ),
    ]
)
