/// The one rule for names that must be unique, wherever plugins meet (validating a
/// directory, ordering candidates, registering modules, rescanning a running set):
///
/// - a plugin name belongs to one file at a time;
/// - a module name belongs to one plugin at a time;
/// - a manifest lists each of its modules once.
///
/// The first to claim a name keeps it; later claimants are refused with a `NameConflict`,
/// which says which rule, who holds the name and the fix, in one wording for every place.
/// A new version of a plugin claims its names once the old one has released them.
///
/// Cost: one dictionary look-up per name.
public struct NameClaims: Sendable {
    /// Who holds a module name.
    public struct Holder: Sendable, Equatable {
        public var plugin: String
        /// The plugin's file, as found in the plugin directory.
        public var file: String

        public init(plugin: String, file: String) {
            self.plugin = plugin
            self.file = file
        }
    }

    /// Plugin name → the file that holds it.
    public private(set) var plugins: [String: String]
    /// Module name → the plugin that holds it.
    public private(set) var modules: [String: Holder]

    /// No name claimed; room for `capacity` plugins (and as many modules) without rehashing.
    public init(capacity: Int = 0) {
        self.init(plugins: capacity, modules: capacity)
    }

    /// No name claimed; room for `plugins` plugins and `modules` modules without rehashing.
    public init(plugins: Int, modules: Int) {
        self.plugins = .init(minimumCapacity: plugins)
        self.modules = .init(minimumCapacity: modules)
    }

    /// True when no name is claimed.
    public var isEmpty: Bool { plugins.isEmpty }

    /// The first rule that `plugin` (from `file`, providing `modules`) breaks against the
    /// names claimed so far, nil when it breaks none: its name held by another file, then a
    /// module listed twice, then a module held by another plugin.
    public func conflict(plugin: String, modules: [String], file: String) -> NameConflict? {
        if let holder = plugins[plugin] {
            return NameConflict(.pluginName(plugin: plugin, heldBy: holder))
        }
        if let repeated = Self.repeated(modules) { return repeated }
        for module in modules {
            if let holder = self.modules[module] {
                return NameConflict(.moduleName(module: module, heldBy: holder))
            }
        }
        return nil
    }

    /// Gives `plugin` (from `file`) its name and `modules`. Call it once `conflict` returned
    /// nil.
    public mutating func claim(plugin: String, modules: [String], file: String) {
        plugins[plugin] = file
        for module in modules { self.modules[module] = Holder(plugin: plugin, file: file) }
    }

    /// `conflict(plugin:modules:file:)`, and when there is none, `claim(plugin:modules:file:)`,
    /// looking each name up once instead of twice (a plan, an order and a registry claim
    /// every plugin's names).
    public mutating func claimIfFree(plugin: String, modules: [String], file: String) -> NameConflict? {
        if let holder = plugins.updateValue(file, forKey: plugin) {
            plugins[plugin] = holder
            return NameConflict(.pluginName(plugin: plugin, heldBy: holder))
        }
        if let repeated = Self.repeatedName(modules) {
            plugins[plugin] = nil
            return NameConflict(.listedTwice(module: repeated))
        }
        for (index, module) in modules.enumerated() {
            guard let holder = self.modules.updateValue(Holder(plugin: plugin, file: file), forKey: module) else { continue }
            // Taken: put back what was there, then free what this plugin claimed so far.
            self.modules[module] = holder
            for claimed in modules[..<index] { self.modules[claimed] = nil }
            plugins[plugin] = nil
            return NameConflict(.moduleName(module: module, heldBy: holder))
        }
        return nil
    }

    /// Frees `plugin`'s name and its modules' names.
    public mutating func release(plugin: String) {
        guard plugins.removeValue(forKey: plugin) != nil else { return }
        modules = modules.filter { $0.value.plugin != plugin }
    }

    /// The first module `modules` lists twice, nil when each is listed once.
    public static func repeated(_ modules: [String]) -> NameConflict? {
        repeatedName(modules).map { NameConflict(.listedTwice(module: $0)) }
    }

    /// The name of the first module `modules` lists twice (what `repeated` reports).
    static func repeatedName(_ modules: [String]) -> String? {
        // Manifests list a handful of modules: comparing pairs beats hashing them.
        for (index, module) in modules.enumerated() where modules[..<index].contains(module) {
            return module
        }
        return nil
    }
}

/// A name `NameClaims` refuses: which rule, the name, who holds it, and the fix.
public struct NameConflict: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// `plugin` is the name of the plugin in file `heldBy`.
        case pluginName(plugin: String, heldBy: String)
        /// `module` is provided by `heldBy`.
        case moduleName(module: String, heldBy: NameClaims.Holder)
        /// The manifest lists `module` more than once.
        case listedTwice(module: String)
    }

    public var kind: Kind

    public init(_ kind: Kind) { self.kind = kind }

    /// What is wrong, e.g. `module counter is already provided by plugin Counter
    /// (/srv/plugins/libCounter.so)`.
    public var problem: String {
        switch kind {
        case .pluginName(let plugin, let file): "plugin name \(plugin) is already used by \(file)"
        case .moduleName(let module, let holder): "module \(module) is already provided by plugin \(holder.plugin) (\(holder.file))"
        case .listedTwice(let module): "module \(module) is listed twice"
        }
    }

    /// What to do about it.
    public var fix: String {
        switch kind {
        case .pluginName: "remove one of the two files or rename one plugin"
        case .moduleName: "rename the module or remove one of the two plugins"
        case .listedTwice: "list each module once, in plugin.json and in the plugin's descriptor"
        }
    }

    public var description: String { "\(problem). Fix: \(fix)" }
}
