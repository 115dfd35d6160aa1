import ModuleKit

/// One struct of the C ABI (`modhost_plugin`, `modhost_module`) as a plugin compiled it:
/// its first field, `struct_size`, says how many bytes the plugin's struct has, and only
/// the fields that lie entirely within those bytes are read. A field the plugin's header
/// did not have yet (an older minor version, docs/abi.md) reads as absent (nil); nothing
/// past `struct_size` is ever touched. Reads are unaligned loads of single fields, never of
/// the whole struct, and every offset is overflow-checked.
struct ABIStruct<Layout> {
    let base: UnsafeRawPointer
    /// The plugin's `struct_size`.
    let size: Int

    /// Reads `struct_size` at `base` (the first four bytes of every ABI struct).
    init(_ base: UnsafeRawPointer) {
        self.base = base
        size = Int(base.loadUnaligned(as: UInt32.self))
    }

    /// The host's size of the struct: what a plugin compiled against this host's header has.
    static var hostSize: Int { MemoryLayout<Layout>.size }

    /// The number of bytes up to the end of `field` in the host's layout.
    static func end<T>(of field: KeyPath<Layout, T>) -> Int {
        // Fields of an imported C struct are stored properties: they have an offset.
        let offset = MemoryLayout<Layout>.offset(of: field)!
        return offset + MemoryLayout<T>.size
    }

    /// True when the plugin's struct holds `field` entirely.
    func has<T>(_ field: KeyPath<Layout, T>) -> Bool {
        guard let offset = MemoryLayout<Layout>.offset(of: field) else { return false }
        let (end, overflow) = offset.addingReportingOverflow(MemoryLayout<T>.size)
        return !overflow && end <= size
    }

    /// A 32-bit field, nil when the plugin's struct ends before it.
    func uint32(_ field: KeyPath<Layout, UInt32>) -> UInt32? {
        guard has(field) else { return nil }
        return base.loadUnaligned(fromByteOffset: MemoryLayout<Layout>.offset(of: field)!, as: UInt32.self)
    }

    /// A pointer field (a C pointer or function pointer of any type) as its address; nil
    /// when it is NULL or the plugin's struct ends before it.
    func pointer<T>(_ field: KeyPath<Layout, T>) -> UnsafeRawPointer? {
        precondition(MemoryLayout<T>.size == MemoryLayout<UInt>.size, "not a pointer field")
        guard has(field) else { return nil }
        let bits = base.loadUnaligned(fromByteOffset: MemoryLayout<Layout>.offset(of: field)!, as: UInt.self)
        return UnsafeRawPointer(bitPattern: bits)
    }
}

/// Why a descriptor cannot be read: the problem and the fix, for a `LoadFailure`.
struct DescriptorProblem: Error {
    var check: LoadFailure.Check
    var problem: String
    var fix: String
}

/// The plugin descriptor (`modhost_plugin`) an entry symbol returned, read within its
/// `struct_size`: the host accepts any size from ABI 1.0's (through `modules`) up to its
/// own, and a minor version up to its own.
struct PluginDescriptor {
    typealias Layout = modhost_plugin
    let abiMajor: UInt32
    let abiMinor: UInt32
    let name: String
    let moduleCount: Int
    let modules: UnsafeRawPointer?

    /// The smallest descriptor a plugin of this major version can have: ABI 1.0's fields.
    static let minimumSize = ABIStruct<Layout>.end(of: \.modules)

    init(_ pointer: UnsafeRawPointer) throws(DescriptorProblem) {
        let raw = ABIStruct<Layout>(pointer)
        let rebuild = "rebuild the plugin against this host's modulehost.h (MODHOST_PLUGIN_INIT sets struct_size)"
        // abi_major sits right after struct_size in every major version: read it first, so a
        // plugin of another major is told so rather than that its struct has another size.
        guard let major = raw.uint32(\.abi_major) else {
            throw DescriptorProblem(check: .abi, problem: "the plugin descriptor's struct_size is \(raw.size) bytes, too small to hold its ABI version (ABI \(HostSDK.abiMajor).0 descriptors have at least \(Self.minimumSize))", fix: rebuild)
        }
        guard major == UInt32(MODHOST_ABI_MAJOR) else {
            let minor = raw.uint32(\.abi_minor).map { ".\($0)" } ?? ""
            throw DescriptorProblem(check: .abi, problem: "the descriptor says ABI \(major)\(minor), this host provides \(HostSDK.abiMajor).\(HostSDK.abiMinor)", fix: rebuild)
        }
        guard raw.size >= Self.minimumSize, raw.size <= ABIStruct<Layout>.hostSize,
              let minor = raw.uint32(\.abi_minor), let count = raw.uint32(\.module_count), raw.has(\.modules)
        else {
            let bound = raw.size < Self.minimumSize ? "ABI \(HostSDK.abiMajor).0 descriptors have at least \(Self.minimumSize) (through modules)"
                : "ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor) descriptors have at most \(ABIStruct<Layout>.hostSize)"
            throw DescriptorProblem(check: .abi, problem: "the plugin descriptor's struct_size is \(raw.size) bytes, \(bound)", fix: rebuild)
        }
        guard minor <= UInt32(MODHOST_ABI_MINOR) else {
            throw DescriptorProblem(check: .abi, problem: "the descriptor says ABI \(major).\(minor), this host provides \(HostSDK.abiMajor).\(HostSDK.abiMinor)",
                                    fix: "rebuild the plugin against this host's modulehost.h, or upgrade the host")
        }
        guard let name = raw.pointer(\.name) else {
            throw DescriptorProblem(check: .descriptor, problem: "the plugin descriptor's name is NULL", fix: "set the plugin's name in its descriptor")
        }
        abiMajor = major
        abiMinor = minor
        self.name = String(cString: name.assumingMemoryBound(to: CChar.self))
        moduleCount = Int(count)
        modules = raw.pointer(\.modules)
    }

    /// The module descriptors, each read within the `struct_size` the array's first element
    /// says (the array's stride; every element must say the same).
    func moduleDescriptors() throws(DescriptorProblem) -> [ModuleDescriptor] {
        guard moduleCount > 0 else { return [] }
        guard let first = modules else {
            throw DescriptorProblem(check: .descriptor, problem: "the descriptor lists \(moduleCount) modules but its modules pointer is NULL",
                                    fix: "point `modules` at the module array and set its count")
        }
        let stride = ABIStruct<modhost_module>(first).size
        let minimum = ModuleDescriptor.minimumSize, maximum = ABIStruct<modhost_module>.hostSize
        guard stride >= minimum, stride <= maximum else {
            throw DescriptorProblem(check: .descriptor, problem: "module descriptors are \(stride) bytes, ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor) needs "
                                    + (stride < minimum ? "at least \(minimum) (through version)" : "at most \(maximum)"),
                                    fix: "initialise struct_size with sizeof(modhost_module)")
        }
        var descriptors: [ModuleDescriptor] = []
        descriptors.reserveCapacity(moduleCount)
        for index in 0..<moduleCount {
            // index < count <= 2^32 and stride <= the host's size: no overflow on 64 bits.
            let element = first.advanced(by: index * stride)
            let size = ABIStruct<modhost_module>(element).size
            guard size == stride else {
                throw DescriptorProblem(check: .descriptor, problem: "module descriptor \(index) says struct_size \(size), the first says \(stride)",
                                        fix: "initialise struct_size with sizeof(modhost_module) in every module descriptor")
            }
            descriptors.append(try ModuleDescriptor(element))
        }
        return descriptors
    }
}
