// swift-tools-version:6.0
// ModuleHost: a plugin host for Swift services on Linux. See README.md.
import PackageDescription

let swift6: [SwiftSetting] = [.swiftLanguageMode(.v6)]
// The executables find libModuleKit.so in ../lib once installed (build/bin, PREFIX/bin).
let installedRunpath: [LinkerSetting] = [.unsafeFlags(["-Xlinker", "-rpath", "-Xlinker", "$ORIGIN/../lib"])]

let package = Package(
    name: "ModuleHost",
    products: [
        .executable(name: "modhostd", targets: ["modhostd"]),
        .executable(name: "modhostctl", targets: ["modhostctl"]),
        .executable(name: "modhost-bench", targets: ["modhost-bench"]),
        .executable(name: "modhost-trial", targets: ["modhost-trial"]),
        // For a Swift service that embeds the plugin host (docs/embedding.md); with it, the
        // types its API uses: the directory watcher and calls by name. ModuleKit is the
        // nested package's product.
        .library(name: "ModuleHost", targets: ["ModuleHost", "DaemonKit", "PluginCall"]),
    ],
    dependencies: [
        // The SDK lives in a nested package so that it is one shared library per process.
        .package(path: "Sources/ModuleKit"),
    ],
    targets: [
        // libffi, from Debian's libffi-dev.
        .systemLibrary(name: "CFFI", path: "Sources/CFFI", pkgConfig: "libffi",
                       providers: [.apt(["libffi-dev"])]),
        // dladdr, which needs _GNU_SOURCE.
        .target(name: "CDynamicLoader"),
        // The one check that a symbol is a plugin's own (not a dependency's): plain C, so that
        // the loader, calls by name and modhost-trial (which links only libc) share it.
        .target(name: "CSymbolOwnership"),
        // Reading plugin files without running them: ELF structure and the manifest. JSON is
        // read with ModuleKit's `JSONValue.parse`, the one strict parser (the SDK is the
        // lowest layer).
        .target(name: "PluginFormat", dependencies: [.product(name: "ModuleKit", package: "ModuleKit")],
                swiftSettings: swift6),
        // Calling plugin functions by name through libffi.
        .target(name: "PluginCall", dependencies: ["CFFI", "CSymbolOwnership", "PluginFormat",
                                                   .product(name: "ModuleKit", package: "ModuleKit")],
                swiftSettings: swift6),
        // Daemon plumbing that knows nothing of plugins: signals, inotify, the control
        // socket, systemd notification.
        .target(name: "DaemonKit", dependencies: [.product(name: "ModuleKit", package: "ModuleKit")],
                swiftSettings: swift6),
        // The host runtime: validation, loading, registry, daemon, control protocol.
        .target(
            name: "ModuleHost",
            dependencies: [
                .product(name: "ModuleKit", package: "ModuleKit"),
                "CDynamicLoader", "PluginFormat", "PluginCall", "DaemonKit",
            ],
            swiftSettings: swift6),
        .executableTarget(name: "modhostd", dependencies: ["ModuleHost"], swiftSettings: swift6,
                         linkerSettings: installedRunpath),
        .executableTarget(name: "modhostctl", dependencies: ["ModuleHost"], swiftSettings: swift6,
                          linkerSettings: installedRunpath),
        // Loads one plugin in a short-lived process before the daemon does (plain C: starts
        // in a millisecond).
        // Links nothing but libc; the daemon preloads ModuleKit for Swift plugins.
        .executableTarget(
            name: "modhost-trial",
            dependencies: ["CSymbolOwnership"],
            cSettings: [.unsafeFlags(["-I", Context.packageDirectory + "/Sources/ModuleKit/Sources/CModuleHost/include"])],
            linkerSettings: [.unsafeFlags(["-Xlinker", "--as-needed"])]),
        // Benchmarks, run by `make bench`, apart from the tests.
        .executableTarget(
            name: "modhost-bench",
            dependencies: ["ModuleHost", "PluginCall", "PluginFormat", "DaemonKit", "TestSupport",
                           .product(name: "ModuleKit", package: "ModuleKit")],
            swiftSettings: swift6, linkerSettings: installedRunpath),
        .target(
            name: "TestSupport",
            dependencies: [.product(name: "ModuleKit", package: "ModuleKit"), "PluginFormat"],
            swiftSettings: swift6),
        .testTarget(
            name: "ModuleKitTests",
            dependencies: [.product(name: "ModuleKit", package: "ModuleKit"), "TestSupport"],
            swiftSettings: swift6),
        .testTarget(
            name: "PluginFormatTests",
            dependencies: ["PluginFormat", "TestSupport", .product(name: "ModuleKit", package: "ModuleKit")],
            swiftSettings: swift6),
        .testTarget(name: "PluginCallTests", dependencies: ["PluginCall", "TestSupport"], swiftSettings: swift6),
        .testTarget(name: "DaemonKitTests", dependencies: ["DaemonKit", "TestSupport"], swiftSettings: swift6),
        .testTarget(
            name: "ModuleHostTests",
            dependencies: ["ModuleHost", "TestSupport", .product(name: "ModuleKit", package: "ModuleKit")],
            swiftSettings: swift6),
    ]
)

// Fuzz targets (Tests/Fuzzing, run by `make fuzz`): declared only when the Makefile asks
// for them, because they link libFuzzer's `main` and so build only with
// `swift build --sanitize=fuzzer`.
if Context.environment["MODHOST_FUZZ"] == "1" {
    package.targets.append(.target(
        name: "FuzzSupport", dependencies: ["PluginFormat"], path: "Tests/Fuzzing/Support", swiftSettings: swift6))
    let fuzzTargets: [(name: String, dependencies: [Target.Dependency])] = [
        ("fuzz-plugin-file", ["ModuleHost", "PluginFormat"]),
        ("fuzz-manifest", ["PluginFormat", .product(name: "ModuleKit", package: "ModuleKit")]),
        ("fuzz-control-request", ["ModuleHost", "DaemonKit", "PluginCall", .product(name: "ModuleKit", package: "ModuleKit")]),
        ("fuzz-configuration", ["ModuleHost"]),
    ]
    for target in fuzzTargets {
        package.targets.append(.executableTarget(
            name: target.name, dependencies: target.dependencies + ["FuzzSupport"],
            path: "Tests/Fuzzing/Targets/\(target.name)", swiftSettings: swift6))
    }
}
