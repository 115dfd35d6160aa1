// swift-tools-version:6.0
// ModuleKit: the SDK every plugin and the host share. It is a package of its own so
// that SwiftPM links it as one dynamic library (libModuleKit.so) that exists once per
// process; see docs/abi.md and FINDINGS section 1 for why.
import PackageDescription

let package = Package(
    name: "ModuleKit",
    products: [
        .library(name: "ModuleKit", type: .dynamic, targets: ["ModuleKit"]),
    ],
    targets: [
        // The C ABI: the contract for plugins written in plain C.
        .target(name: "CModuleHost"),
        .target(
            name: "ModuleKit",
            dependencies: ["CModuleHost"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
