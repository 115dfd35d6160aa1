import Glibc
@_spi(ModuleHost) import ModuleKit
import PluginCall
import PluginFormat

/// A plugin whose image is mapped and whose entry symbol described its modules.
public struct LoadedPlugin: Sendable {
    public struct Module: Sendable {
        public let factory: ModuleFactory
        public let swiftType: (any PluginModule.Type)?
    }
    public let file: PluginFile
    /// The image mapped in this process; nil for an isolated plugin, whose code runs in its
    /// worker process only.
    public let library: DynamicLibrary?
    public let modules: [Module]
    /// The functions the manifest declares for calling by name, checked to be defined in
    /// this file; nil when it declares none (and for an isolated plugin: see `isolated`).
    public let functions: FunctionTable?
    /// The worker an isolated plugin runs in (docs/isolation.md); nil in process.
    public let isolated: IsolatedPlugin?
    public var name: String { file.name }

    init(file: PluginFile, library: DynamicLibrary?, modules: [Module], functions: FunctionTable?, isolated: IsolatedPlugin? = nil) {
        self.file = file
        self.library = library
        self.modules = modules
        self.functions = functions
        self.isolated = isolated
    }
}

/// Opens validated plugin files (`open`): the checks that need the plugin's code, right
/// after `dlopen`. A `PluginSet` finds, validates and orders the files and registers what
/// this opens (`PluginPlan` plans the same without opening anything); an isolated plugin's
/// worker opens its one plugin with it.
///
/// A value type holding only shared, thread-safe state: `open` may be called from any
/// thread, and never registers anything.
public struct PluginLoader: Sendable {
    /// Makes the host service table each C module instance receives.
    public var hostServices: @Sendable (_ moduleName: String, _ host: HostInstance) throws -> CHostServices
    /// Where the C modules of the plugins this loader opens run their code (one worker per
    /// module instance), and where the daemon sees which of them are stuck.
    public let workers: PluginWorkers
    /// Where the calls by name into the plugins it opens are counted; nil counts nothing.
    public let metrics: PluginSetMetrics?

    public init(workers: PluginWorkers = PluginWorkers(),
                hostServices: (@Sendable (String, HostInstance) throws -> CHostServices)? = nil,
                metrics: PluginSetMetrics? = nil) {
        self.metrics = metrics
        self.workers = workers
        self.hostServices = hostServices ?? { (name: String, host: HostInstance) throws -> CHostServices in
            try CHostServices(
                moduleName: name, logger: host.logger(for: name),
                post: { notification, payload in host.postFromAnywhere(notification: notification, payload: payload) },
                hasModule: { host.isRunning(moduleNamed: $0) })
        }
    }

    /// Opens one validated plugin: `dlopen` with RTLD_NOW, finds the entry symbol in the
    /// file itself, calls it and checks the descriptor against the manifest.
    public func open(_ file: PluginFile) throws(LoadFailure) -> LoadedPlugin {
        func fail(_ check: LoadFailure.Check, _ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: file.path, check: check, problem: problem, fix: fix)
        }
        let library: DynamicLibrary
        do {
            library = try DynamicLibrary(path: file.resolvedPath)
        } catch {
            throw .dlopenFailed(file.path, message: error.message)
        }
        let entry: UnsafeMutableRawPointer
        switch library.symbol(MODHOST_ENTRY_SYMBOL) {
        case .success(let address): entry = address
        case .failure:
            throw .entryMissing(file.path)
        }
        switch library.owner(of: entry) {
        case .plugin: break
        case .other(let owner): throw .entryForeign(file.path, owner: owner)
        case .unknown: throw .entryForeign(file.path, owner: nil)
        }
        if file.manifest.language == .swift, let sdk = HostSDK.library {
            // The ModuleKit this plugin's scope resolves must be the host's.
            if case .success(let address) = library.symbol("modhost_abi_compatible"), sdk.owner(of: address) != .plugin {
                let owner = DynamicLibrary.file(containing: address) ?? "an unknown object"
                throw fail(.sdkLinkage, "the plugin resolves ModuleKit from \(owner), the host uses \(HostSDK.current.libraryPath)",
                           "build the plugin against the host's SDK and do not ship a libModuleKit.so with it")
            }
        }
        let function = unsafeBitCast(entry, to: modhost_plugin_entry_fn.self)
        guard let descriptor = function() else { throw .entryReturnedNull(file.path) }
        let modules: [LoadedPlugin.Module]
        do throws(DescriptorProblem) {
            let plugin = try PluginDescriptor(UnsafeRawPointer(descriptor))
            guard plugin.name == file.manifest.name else {
                let failure = LoadFailure.descriptorNamesAnotherPlugin(file.path, described: plugin.name, manifest: file.manifest.name)
                throw DescriptorProblem(check: failure.check, problem: failure.problem, fix: failure.fix)
            }
            modules = try describeModules(plugin, file)
        } catch {
            throw fail(error.check, error.problem, error.fix)
        }
        let described = modules.map(\.factory.name)
        guard described == file.manifest.modules else {
            throw .modulesDiffer(file.path, described: described, manifest: file.manifest.modules)
        }
        var functions: FunctionTable?
        if !file.manifest.exports.isEmpty {
            do {
                functions = try FunctionTable(pluginName: file.name, exports: file.manifest.exports,
                                              handle: library.handle, pluginPath: file.resolvedPath,
                                              metrics: metrics?.calls(plugin: file.name))
            } catch {
                throw fail(.exports, "\(error)", "define every function listed in plugin.json's exports in this plugin, with the declared signature")
            }
        }
        return LoadedPlugin(file: file, library: library, modules: modules, functions: functions)
    }

    private func describeModules(_ plugin: PluginDescriptor, _ file: PluginFile) throws(DescriptorProblem) -> [LoadedPlugin.Module] {
        func fail(_ problem: String, _ fix: String) -> DescriptorProblem {
            DescriptorProblem(check: .descriptor, problem: problem, fix: fix)
        }
        guard plugin.moduleCount > 0 || file.manifest.modules.isEmpty else {
            throw fail("the descriptor lists no modules", "point `modules` at the module array and set its count")
        }
        var modules: [LoadedPlugin.Module] = []
        for descriptor in try plugin.moduleDescriptors() {
            let order = file.manifest.order
            switch Int(descriptor.kind) {
            case Int(MODHOST_MODULE_SWIFT.rawValue):
                guard let box = descriptor.swiftType, let type = PluginExport.moduleType(box) else {
                    throw DescriptorProblem(check: .sdkLinkage,
                                      problem: "module \(descriptor.name)'s type is not a ModuleKit type of this process (the plugin uses another copy of ModuleKit)",
                                      fix: "link the plugin against the host's libModuleKit.so with plugin.mk")
                }
                guard type.name == descriptor.name else {
                    throw fail("module type \(type) is named \(type.name), the descriptor says \(descriptor.name)", "rebuild the plugin")
                }
                modules.append(.init(factory: ModuleFactory(type, plugin: file.name, defaultOrder: order), swiftType: type))
            case Int(MODHOST_MODULE_C.rawValue):
                guard descriptor.create != nil, descriptor.handleEvent != nil || descriptor.receive != nil, descriptor.destroy != nil else {
                    throw fail("C module \(descriptor.name) lacks create, handle_event (or receive) or destroy (its struct_size is \(descriptor.structSize) bytes)",
                               "set create, destroy, and handle_event or receive")
                }
                let services = hostServices
                let workers = workers
                let factory = ModuleFactory(name: descriptor.name, version: descriptor.version, plugin: file.name, defaultOrder: order) {
                    host, configuration in
                    // `create` runs on the module's worker, waited for at most the event deadline.
                    host.handlerKeepsItsOwnDeadline()
                    do {
                        return CModule(descriptor: descriptor, configuration: configuration, services: try services(descriptor.name, host),
                                       host: host, workers: workers)
                    } catch {
                        host.logger(for: descriptor.name).error("cannot create the host services of a C module: \(error)")
                        return nil
                    }
                }
                modules.append(.init(factory: factory, swiftType: nil))
            default:
                throw fail("module \(descriptor.name) has kind \(descriptor.kind), expected MODHOST_MODULE_C (1) or MODHOST_MODULE_SWIFT (2)",
                           "set kind to MODHOST_MODULE_C")
            }
        }
        return modules
    }
}
