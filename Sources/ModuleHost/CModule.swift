import ModuleKit

/// A module written in C, seen by the host as a `Module`: each event becomes a call of the
/// descriptor's `handle_event` with the event's name and JSON payload.
///
/// It lives on its host instance's serial context like any module, so the C functions of
/// one instance are never called concurrently.
final class CModule: Module {
    let descriptor: ModuleDescriptor
    let instance: UnsafeMutableRawPointer?
    /// Keeps the per-module host API table (and what its functions point into) alive until
    /// `destroy` has returned.
    let services: CHostServices
    private var destroyed = false

    let moduleName: String
    let notifications: Set<String>
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: descriptor.version, metadata: ["language": "c"]) }

    /// Creates the C instance; nil when `create` returns NULL.
    init?(descriptor: ModuleDescriptor, configuration: JSONValue, services: CHostServices) {
        self.descriptor = descriptor
        self.services = services
        moduleName = descriptor.name
        notifications = Set(descriptor.notifications)
        guard let create = descriptor.pointer.pointee.create,
              let instance = configuration.jsonText.withCString({ create(services.table, $0) })
        else { return nil }
        self.instance = instance
    }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        deliver(event.name, event.payload)
        if case .deinitialize = event, !destroyed {
            destroyed = true
            descriptor.pointer.pointee.destroy?(instance)
        }
    }

    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
        deliver(event.name, event.payload)
    }

    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        // A C module keeps its instance; it sees the change as a configurationChanged event.
        self
    }

    private func deliver(_ name: String, _ payload: JSONValue) {
        guard !destroyed, let handle = descriptor.pointer.pointee.handle_event else { return }
        name.withCString { name in
            if case .null = payload {
                handle(instance, name, nil)
            } else {
                payload.jsonText.withCString { handle(instance, name, $0) }
            }
        }
    }
}

/// A C module descriptor in the plugin's static storage.
///
/// `@unchecked Sendable`: it points at memory the plugin declares immutable for the life
/// of the process (docs/abi.md), and the image is never unloaded; nothing writes to it.
struct ModuleDescriptor: @unchecked Sendable {
    let pointer: UnsafePointer<modhost_module>
    let name: String
    let version: String
    let notifications: [String]

    init(_ pointer: UnsafePointer<modhost_module>) {
        self.pointer = pointer
        name = String(cString: pointer.pointee.name)
        version = String(cString: pointer.pointee.version)
        var names: [String] = []
        if var cursor = pointer.pointee.notifications {
            while let name = cursor.pointee {
                names.append(String(cString: name))
                cursor += 1
            }
        }
        notifications = names
    }
}
