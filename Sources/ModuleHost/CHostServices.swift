import CFFI
import Glibc
import ModuleKit

/// The `modhost_host_api` table one C module instance receives. C function pointers carry
/// no context, so each function in the table is a libffi closure bound to this object:
/// `log` lines carry the module's name and `post_notification` reaches the module's own
/// host instance, with no context argument in the C signature.
///
/// The table, the closures and their call interfaces are allocated in `init` and freed in
/// `deinit`; a `CModule` keeps its services alive until after the module's `destroy`.
/// The functions may be called from any thread: everything they touch is immutable or
/// `Sendable`.
public final class CHostServices {
    public let moduleName: String
    let logger: Logger
    let post: @Sendable (String, JSONValue) -> Void
    let hasModule: @Sendable (String) -> Bool

    let table: UnsafeMutablePointer<modhost_host_api>
    private var closures: [BoundClosure] = []

    /// - Parameters:
    ///   - post: delivers a notification to the module's host instance, asynchronously.
    ///   - hasModule: answers whether a module of that name runs in the host instance.
    public init(moduleName: String, logger: Logger,
                post: @escaping @Sendable (String, JSONValue) -> Void,
                hasModule: @escaping @Sendable (String) -> Bool) {
        self.moduleName = moduleName
        self.logger = logger
        self.post = post
        self.hasModule = hasModule
        table = .allocate(capacity: 1)
        let context = Unmanaged.passUnretained(self).toOpaque()
        let log = BoundClosure(result: modhost_ffi_type_void(), arguments: [modhost_ffi_type_sint32(), modhost_ffi_type_pointer()],
                               context: context, body: logTrampoline)
        let post = BoundClosure(result: modhost_ffi_type_void(), arguments: [modhost_ffi_type_pointer(), modhost_ffi_type_pointer()],
                                context: context, body: postTrampoline)
        let has = BoundClosure(result: modhost_ffi_type_uint8(), arguments: [modhost_ffi_type_pointer()],
                               context: context, body: hasModuleTrampoline)
        closures = [log, post, has]
        table.initialize(to: modhost_host_api(
            struct_size: UInt32(MemoryLayout<modhost_host_api>.size), abi_minor: UInt32(MODHOST_ABI_MINOR),
            log: unsafeBitCast(log.code, to: (@convention(c) (Int32, UnsafePointer<CChar>) -> Void).self),
            post_notification: unsafeBitCast(post.code, to: (@convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>?) -> Void).self),
            has_module: unsafeBitCast(has.code, to: (@convention(c) (UnsafePointer<CChar>) -> Bool).self)))
    }

    deinit {
        table.deinitialize(count: 1)
        table.deallocate()
    }

    fileprivate static func from(_ context: UnsafeMutableRawPointer?) -> CHostServices {
        Unmanaged<CHostServices>.fromOpaque(context!).takeUnretainedValue()
    }
}

private typealias ClosureBody = @convention(c) (
    UnsafeMutablePointer<ffi_cif>?, UnsafeMutableRawPointer?, UnsafeMutablePointer<UnsafeMutableRawPointer?>?, UnsafeMutableRawPointer?
) -> Void

private let logTrampoline: ClosureBody = { _, _, arguments, context in
    let services = CHostServices.from(context)
    let level = arguments![0]!.load(as: Int32.self)
    guard let message = arguments![1]!.load(as: UnsafePointer<CChar>?.self) else { return }
    let logLevel = LogLevel(rawValue: Int(level)) ?? .info
    services.logger.log(logLevel, String(cString: message))
}

private let postTrampoline: ClosureBody = { _, _, arguments, context in
    let services = CHostServices.from(context)
    guard let name = arguments![0]!.load(as: UnsafePointer<CChar>?.self) else { return }
    var payload = JSONValue.null
    if let text = arguments![1]!.load(as: UnsafePointer<CChar>?.self) {
        let bytes = Array(String(cString: text).utf8)
        if let value = try? JSONValue.parse(bytes) {
            payload = value
        } else {
            services.logger.warning("post_notification payload is not JSON; delivered as a string")
            payload = .string(String(cString: text))
        }
    }
    services.post(String(cString: name), payload)
}

private let hasModuleTrampoline: ClosureBody = { _, result, arguments, context in
    let services = CHostServices.from(context)
    var answer = false
    if let name = arguments![0]!.load(as: UnsafePointer<CChar>?.self) {
        answer = services.hasModule(String(cString: name))
    }
    // libffi widens small integer results to ffi_arg.
    result!.storeBytes(of: ffi_arg(answer ? 1 : 0), as: ffi_arg.self)
}

/// One libffi closure with its call interface; everything is freed on deinit.
private final class BoundClosure {
    let code: UnsafeMutableRawPointer
    private let closure: UnsafeMutableRawPointer
    private let cif: UnsafeMutablePointer<ffi_cif>
    private let argumentTypes: UnsafeMutablePointer<UnsafeMutablePointer<ffi_type>?>

    init(result: UnsafeMutablePointer<ffi_type>, arguments: [UnsafeMutablePointer<ffi_type>],
         context: UnsafeMutableRawPointer, body: ClosureBody) {
        cif = .allocate(capacity: 1)
        argumentTypes = .allocate(capacity: arguments.count)
        for (index, type) in arguments.enumerated() { argumentTypes[index] = type }
        var code: UnsafeMutableRawPointer?
        guard let closure = ffi_closure_alloc(modhost_ffi_closure_size(), &code), let code else {
            fatalError("ffi_closure_alloc failed: out of executable memory")
        }
        self.closure = closure
        self.code = code
        let prepared = ffi_prep_cif(cif, modhost_ffi_default_abi(), UInt32(arguments.count), result, argumentTypes)
        let bound = ffi_prep_closure_loc(closure.assumingMemoryBound(to: ffi_closure.self), cif, body, context, code)
        precondition(prepared == FFI_OK && bound == FFI_OK, "libffi could not prepare a host service closure")
    }

    deinit {
        ffi_closure_free(closure)
        cif.deallocate()
        argumentTypes.deallocate()
    }
}
