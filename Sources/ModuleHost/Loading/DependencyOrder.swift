import PluginFormat

/// Puts plugins in load order: every plugin after the plugins it depends on, ties broken
/// by order (configured, else the manifest's) and then by name. Plugins that cannot be
/// loaded because of their dependencies, or whose names `NameClaims` refuses (the first
/// candidate keeps a name), are returned as failures, never silently dropped.
///
/// Cost: linear in plugins and dependency edges, plus a heap for the ties.
public struct DependencyOrder: Sendable {
    public var ordered: [PluginFile] = []
    public var refused: [LoadFailure] = []

    /// `loaded` names plugins already running (a dependency on them is satisfied);
    /// `orderOverride` maps plugin names to configured orders.
    public init(_ candidates: [PluginFile], loaded: Set<String> = [], orderOverride: [String: Int] = [:]) {
        self.init(candidates, loaded: loaded, orderOverride: orderOverride, namesClaimed: false)
    }

    /// `namesClaimed`: the caller already refused every candidate whose names an earlier one
    /// holds (`NameClaims`, in this order), so claiming them again would find nothing.
    init(_ candidates: [PluginFile], loaded: Set<String>, orderOverride: [String: Int], namesClaimed: Bool) {
        let plugins = namesClaimed ? candidates : claimingNames(candidates)
        func rank(_ plugin: PluginFile) -> Rank { Rank(order: orderOverride[plugin.name] ?? plugin.manifest.order, name: plugin.name) }
        // Nothing depends on anything (the common case): order and name decide.
        if plugins.allSatisfy({ $0.manifest.dependencies.isEmpty }) {
            ordered = plugins.sorted { rank($0) < rank($1) }
            return
        }
        let byName = Dictionary(uniqueKeysWithValues: plugins.map { ($0.name, $0) })  // names are unique now
        // Dependents of each plugin, to propagate refusals and to count what each waits for.
        var dependents: [String: [String]] = [:]
        for plugin in plugins {
            for dependency in Set(plugin.manifest.dependencies) { dependents[dependency, default: []].append(plugin.name) }
        }
        let refusedNames = Self.refusals(byName, loaded: loaded, dependents: dependents)

        // Kahn's algorithm, always taking the ready plugin of lowest (order, name).
        var waitingFor: [String: Int] = [:]
        var ready = Heap<Rank>()
        for (name, plugin) in byName where refusedNames[name] == nil {
            let pending = Set(plugin.manifest.dependencies).filter { !loaded.contains($0) }.count
            waitingFor[name] = pending
            if pending == 0 { ready.push(rank(plugin)) }
        }
        while let next = ready.pop(), let plugin = byName[next.name] {
            ordered.append(plugin)
            for dependent in dependents[next.name] ?? [] where refusedNames[dependent] == nil {
                guard var count = waitingFor[dependent], !loaded.contains(next.name), let waiting = byName[dependent] else { continue }
                count -= 1
                waitingFor[dependent] = count
                if count == 0 { ready.push(rank(waiting)) }
            }
        }
        refused += refusedNames.values.sorted { $0.file < $1.file }
    }

    /// `candidates` without those refused (into `refused`) because an earlier one holds a
    /// plugin or module name of theirs: the first file keeps a name.
    private mutating func claimingNames(_ candidates: [PluginFile]) -> [PluginFile] {
        var claims = NameClaims(capacity: candidates.count)
        var plugins: [PluginFile] = []
        plugins.reserveCapacity(candidates.count)
        for plugin in candidates {
            if let conflict = claims.claimIfFree(plugin: plugin.name, modules: plugin.manifest.modules, file: plugin.path) {
                refused.append(LoadFailure(file: plugin.path, conflict: conflict))
                continue
            }
            plugins.append(plugin)
        }
        return plugins
    }

    /// The plugins of `byName` that cannot load because of their dependencies, by name:
    /// every member of a dependency cycle (naming the cycle), every plugin needing one that
    /// is neither `loaded` nor present, and, transitively, every plugin depending on one
    /// refused.
    private static func refusals(_ byName: [String: PluginFile], loaded: Set<String>,
                                 dependents: [String: [String]]) -> [String: LoadFailure] {
        var refused: [String: LoadFailure] = [:]
        for cycle in cycles(byName) {
            let path = (cycle + [cycle[0]]).joined(separator: " -> ")
            for name in cycle {
                refused[name] = LoadFailure(
                    file: byName[name]?.path ?? name, check: .cycle, problem: "plugin \(name) is in the dependency cycle \(path)",
                    fix: "remove one of these dependencies from the plugins' manifests")
            }
        }
        for (name, plugin) in byName.sorted(by: { $0.key < $1.key }) where refused[name] == nil {
            if let missing = plugin.manifest.dependencies.first(where: { !loaded.contains($0) && byName[$0] == nil }) {
                refused[name] = LoadFailure(
                    file: plugin.path, check: .dependency, problem: "plugin \(name) needs \(missing): dependency \(missing) is not available",
                    fix: "install plugin \(missing) in a plugin directory")
            }
        }
        var queue = refused.keys.sorted()
        while let name = queue.popLast(), let check = refused[name]?.check {
            for dependent in dependents[name] ?? [] where refused[dependent] == nil {
                refused[dependent] = .dependencyRefused(byName[dependent]?.path ?? dependent, plugin: dependent, dependency: name, check: check)
                queue.append(dependent)
            }
        }
        return refused
    }

    struct Rank: Comparable {
        var order: Int
        var name: String
        static func < (lhs: Rank, rhs: Rank) -> Bool { (lhs.order, lhs.name) < (rhs.order, rhs.name) }
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

/// A binary min-heap.
struct Heap<Element: Comparable> {
    private var items: [Element] = []

    mutating func push(_ item: Element) {
        items.append(item)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child] < items[parent] else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    mutating func pop() -> Element? {
        guard !items.isEmpty else { return nil }
        items.swapAt(0, items.count - 1)
        let top = items.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < items.count && items[left] < items[smallest] { smallest = left }
            if right < items.count && items[right] < items[smallest] { smallest = right }
            if smallest == parent { break }
            items.swapAt(parent, smallest)
            parent = smallest
        }
        return top
    }
}
