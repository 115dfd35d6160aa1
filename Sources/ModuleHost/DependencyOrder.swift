/// Puts plugins in load order: every plugin after the plugins it depends on, ties broken
/// by order (configured, else the manifest's) and then by name. Plugins that cannot be
/// loaded because of their dependencies are returned as failures, never silently dropped.
public struct DependencyOrder: Sendable {
    public var ordered: [PluginFile] = []
    public var refused: [LoadFailure] = []

    /// `loaded` names plugins already running (a dependency on them is satisfied);
    /// `orderOverride` maps plugin names to configured orders.
    public init(_ plugins: [PluginFile], loaded: Set<String> = [], orderOverride: [String: Int] = [:]) {
        let byName = Dictionary(plugins.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        func rank(_ plugin: PluginFile) -> (Int, String) { (orderOverride[plugin.name] ?? plugin.manifest.order, plugin.name) }

        // Cycles first: every member of a strongly connected component of two or more
        // (or a self-dependency) is refused, naming the cycle.
        var refusedNames: [String: LoadFailure] = [:]
        for cycle in Self.cycles(byName) {
            let path = (cycle + [cycle[0]]).joined(separator: " -> ")
            for name in cycle {
                refusedNames[name] = LoadFailure(
                    file: byName[name]!.path, check: .cycle, problem: "plugin \(name) is in the dependency cycle \(path)",
                    fix: "remove one of these dependencies from the plugins' manifests")
            }
        }

        // Kahn's algorithm over the rest, picking the lowest rank among ready plugins.
        var remaining = byName.filter { refusedNames[$0.key] == nil }
        var done = loaded
        while !remaining.isEmpty {
            // Refuse whatever depends on something neither loaded, pending nor fine.
            var changed = true
            while changed {
                changed = false
                for (name, plugin) in remaining.sorted(by: { $0.key < $1.key }) {
                    guard let missing = plugin.manifest.dependencies.first(where: { dependency in
                        !done.contains(dependency) && remaining[dependency] == nil
                    }) else { continue }
                    let reason = refusedNames[missing].map { "dependency \(missing) was refused (\($0.check.rawValue))" }
                        ?? "dependency \(missing) is not available"
                    refusedNames[name] = LoadFailure(
                        file: plugin.path, check: .dependency, problem: "plugin \(name) needs \(missing): \(reason)",
                        fix: refusedNames[missing] == nil ? "install plugin \(missing) in a plugin directory" : "fix plugin \(missing) first")
                    remaining[name] = nil
                    changed = true
                }
            }
            let ready = remaining.values.filter { $0.manifest.dependencies.allSatisfy(done.contains) }
            guard let next = ready.min(by: { rank($0) < rank($1) }) else { break }
            ordered.append(next)
            done.insert(next.name)
            remaining[next.name] = nil
        }
        refused = refusedNames.values.sorted { $0.file < $1.file }
    }

    /// Dependency cycles among `plugins` (Tarjan's strongly connected components), each
    /// listed from its alphabetically first member along dependency edges.
    static func cycles(_ plugins: [String: PluginFile]) -> [[String]] {
        var index = 0
        var indices: [String: Int] = [:], lowlink: [String: Int] = [:]
        var stack: [String] = [], onStack: Set<String> = []
        var result: [[String]] = []

        func connect(_ name: String) {
            indices[name] = index
            lowlink[name] = index
            index += 1
            stack.append(name)
            onStack.insert(name)
            for dependency in plugins[name]!.manifest.dependencies where plugins[dependency] != nil {
                if indices[dependency] == nil {
                    connect(dependency)
                    lowlink[name] = min(lowlink[name]!, lowlink[dependency]!)
                } else if onStack.contains(dependency) {
                    lowlink[name] = min(lowlink[name]!, indices[dependency]!)
                }
            }
            guard lowlink[name] == indices[name] else { return }
            var component: [String] = []
            while let top = stack.popLast() {
                onStack.remove(top)
                component.append(top)
                if top == name { break }
            }
            let selfLoop = plugins[name]!.manifest.dependencies.contains(name)
            if component.count > 1 || selfLoop { result.append(walk(component)) }
        }

        // Order a component as a readable cycle: start at the smallest name and follow
        // dependencies that stay inside the component.
        func walk(_ component: [String]) -> [String] {
            let members = Set(component)
            var path = [component.min()!]
            while path.count < members.count,
                  let next = plugins[path.last!]!.manifest.dependencies.first(where: { members.contains($0) && !path.contains($0) }) {
                path.append(next)
            }
            return path
        }

        for name in plugins.keys.sorted() where indices[name] == nil { connect(name) }
        return result
    }
}
