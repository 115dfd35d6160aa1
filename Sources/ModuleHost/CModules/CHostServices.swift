import ModuleKit
import PluginCall

/// The `modhost_host_api` table one C module instance receives. C function pointers carry
/// no context, so each function in the table is a libffi closure (`HostCallbacks`) bound
/// to this module: `log` lines carry the module's name (and are cut to 4096 bytes) and `post_notification` reaches the
/// module's own host instance, with no context argument in the C signature.
///
/// The table and the closures live as long as this object; a `CModule` keeps its services
/// until after the module's `destroy` has returned. The functions may be called from any
/// thread: the handlers are `Sendable`.
///
/// `@unchecked Sendable`: it wraps the C table, written once in `init` and only read after
/// (by the module's C code and by `deinit`), and the closures it points at, which are
/// themselves `Sendable`; every stored property is a `let`.
public final class CHostServices: @unchecked Sendable {
    public let moduleName: String
    let table: UnsafeMutablePointer<modhost_host_api>
    private let callbacks: HostCallbacks

    /// - Parameters:
    ///   - post: delivers a notification to the module's host instance, asynchronously.
    ///   - hasModule: answers whether a module of that name runs in the host instance.
    public init(moduleName: String, logger: Logger,
                post: @escaping @Sendable (String, JSONValue) -> Void,
                hasModule: @escaping @Sendable (String) -> Bool) throws(FFIClosureError) {
        self.moduleName = moduleName
        let lifecyclePosts = DropReport.lifecycleNamedNotifications(poster: "module \(moduleName)", logger: logger)
        callbacks = try HostCallbacks(
            // Cut as an isolated plugin's lines are (LogLineRate.maximumText), in process too.
            log: { level, message in logger.log(LogLevel(rawValue: Int(level)) ?? .info, LogLineRate.bounded(message)) },
            postNotification: { name, payloadJSON in
                if ModuleEvent.lifecycleNames.contains(name) { return lifecyclePosts.count() }
                let (payload, problem) = Self.payload(payloadJSON, name: name)
                if let problem { logger.warning(problem) }
                post(name, payload)
            },
            hasModule: hasModule)
        table = .allocate(capacity: 1)
        table.initialize(to: modhost_host_api(
            struct_size: UInt32(MemoryLayout<modhost_host_api>.size), abi_minor: UInt32(MODHOST_ABI_MINOR),
            log: callbacks.log, post_notification: callbacks.postNotification, has_module: callbacks.hasModule))
    }

    /// The payload a C module passed to `post_notification`: null for NULL, the JSON value
    /// when the bytes are JSON by `JSONValue.parse`'s rules, else the text as a string, with
    /// the warning to log (it gives the parser's byte offset).
    static func payload(_ bytes: [UInt8]?, name: String) -> (JSONValue, warning: String?) {
        guard let bytes else { return (.null, nil) }
        do {
            return (try JSONValue.parse(bytes), nil)
        } catch {
            return (.string(String(decoding: bytes, as: UTF8.self)),
                    "post_notification payload for \(name) is \(error); delivered as a string")
        }
    }

    deinit {
        table.deinitialize(count: 1)
        table.deallocate()
    }
}
