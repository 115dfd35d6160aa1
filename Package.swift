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
        .executable(name: "modhost-worker", targets: ["modhost-worker"]),
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
        // OS plumbing that knows nothing of plugins (nor of ModuleKit): signals, inotify, the
        // control socket's line server and client, systemd notification, atomic writes and
        // bounded reads.
        .target(name: "DaemonKit", dependencies: ["CForkGuard"], swiftSettings: swift6),
        // Closing the host's locks in a child that plugin code forks: a pthread_atfork handler,
        // which must take no lock (plain C, on atomics).
        .target(name: "CForkGuard"),
        // The embeddable loading layer: validation, images, registry, dependency order, the
        // plugin set, trial loads, the crash guard, C modules and their workers.
        .target(
            name: "ModuleHost",
            dependencies: [
                .product(name: "ModuleKit", package: "ModuleKit"),
                "CDynamicLoader", "PluginFormat", "PluginCall", "DaemonKit",
            ],
            swiftSettings: swift6),
        // The control protocol: requests, replies, error codes, and the operations a daemon
        // offers (`DaemonControl`), served over DaemonKit's control socket.
        .target(
            name: "ControlProtocol",
            dependencies: [
                .product(name: "ModuleKit", package: "ModuleKit"),
                "PluginFormat", "PluginCall", "DaemonKit", "ModuleHost",
            ],
            swiftSettings: swift6),
        // The daemon: a shell over the plugin set with configuration, signals, the directory
        // watcher, the control socket, systemd and the log backends.
        .target(
            name: "DaemonShell",
            dependencies: [
                .product(name: "ModuleKit", package: "ModuleKit"),
                "PluginFormat", "PluginCall", "DaemonKit", "ModuleHost", "ControlProtocol",
            ],
            swiftSettings: swift6),
        // What modhostd and modhostctl do with their arguments.
        .target(
            name: "CommandLineTools",
            dependencies: [
                .product(name: "ModuleKit", package: "ModuleKit"),
                "PluginFormat", "DaemonKit", "ModuleHost", "ControlProtocol", "DaemonShell",
            ],
            swiftSettings: swift6),
        .executableTarget(name: "modhostd", dependencies: ["CommandLineTools", "ModuleHost"], swiftSettings: swift6,
                         linkerSettings: installedRunpath),
        .executableTarget(name: "modhostctl", dependencies: ["CommandLineTools"], swiftSettings: swift6,
                          linkerSettings: installedRunpath),
        // Runs one isolated plugin in a supervised process of its own (docs/isolation.md);
        // started by modhostd only.
        .executableTarget(name: "modhost-worker", dependencies: ["ModuleHost"], swiftSettings: swift6,
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
        // The host above the plumbing: the loading layer in process, the control protocol,
        // the daemon shell and the command-line tools (mostly through the built modhostd and
        // modhostctl), the documents' examples and the layering itself.
        .testTarget(
            name: "ModuleHostTests",
            dependencies: ["ModuleHost", "ControlProtocol", "DaemonShell", "CommandLineTools", "TestSupport",
                           .product(name: "ModuleKit", package: "ModuleKit")],
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
        ("fuzz-control-request", ["ControlProtocol", "DaemonKit", "PluginCall", .product(name: "ModuleKit", package: "ModuleKit")]),
        ("fuzz-configuration", ["DaemonShell"]),
        ("fuzz-worker-frame", ["ModuleHost", .product(name: "ModuleKit", package: "ModuleKit")]),
    ]
    for target in fuzzTargets {
        package.targets.append(.executableTarget(
            name: target.name, dependencies: target.dependencies + ["FuzzSupport"],
            path: "Tests/Fuzzing/Targets/\(target.name)", swiftSettings: swift6))
    }
}
