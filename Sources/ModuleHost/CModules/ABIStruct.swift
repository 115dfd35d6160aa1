import ModuleKit

/// One struct of the C ABI (`modhost_plugin`, `modhost_module`) as a plugin compiled it:
/// its first field, `struct_size`, says how many bytes the plugin's struct has, and only
/// the fields that lie entirely within those bytes are read. A field the plugin's header
/// did not have yet (an older minor version, docs/abi.md) reads as absent (nil); nothing
/// past `struct_size` is ever touched. Reads are unaligned loads of single fields, never of
/// the whole struct, at the offsets of the host's layout (`ABIField`).
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

    /// True when the plugin's struct holds `field` entirely.
    func has<T>(_ field: ABIField<Layout, T>) -> Bool { field.end <= size }

    /// A 32-bit field, nil when the plugin's struct ends before it.
    func uint32(_ field: ABIField<Layout, UInt32>) -> UInt32? {
        guard has(field) else { return nil }
        return base.loadUnaligned(fromByteOffset: field.offset, as: UInt32.self)
    }

    /// A pointer field (a C pointer or function pointer of any type) as its address; nil
    /// when it is NULL or the plugin's struct ends before it.
    func pointer<T>(_ field: ABIField<Layout, T>) -> UnsafeRawPointer? {
        guard has(field) else { return nil }
        return UnsafeRawPointer(bitPattern: base.loadUnaligned(fromByteOffset: field.offset, as: UInt.self))
    }
}

/// Where one field of an ABI struct lies in the host's layout, computed once from its key
/// path (a key path costs an allocation each time it is used; a plugin's descriptors are
/// read field by field for every plugin loaded).
struct ABIField<Layout, Value>: Sendable {
    /// The field's offset and the offset just past it.
    let offset: Int
    let end: Int

    init(_ field: KeyPath<Layout, Value>) {
        // Fields of an imported C struct are stored properties: they have an offset, and
        // the host's struct is small, so `end` cannot overflow.
        offset = MemoryLayout<Layout>.offset(of: field)!
        end = offset + MemoryLayout<Value>.size
    }

    /// A pointer field (a C pointer or function pointer of any type).
    init(pointer field: KeyPath<Layout, Value>) {
        precondition(MemoryLayout<Value>.size == MemoryLayout<UInt>.size, "not a pointer field")
        self.init(field)
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

    /// The fields read, in the host's layout.
    private enum Field {
        static let abiMajor = ABIField(\Layout.abi_major)
        static let abiMinor = ABIField(\Layout.abi_minor)
        static let moduleCount = ABIField(\Layout.module_count)
        static let name = ABIField(pointer: \Layout.name)
        static let modules = ABIField(pointer: \Layout.modules)
    }

    /// The smallest descriptor a plugin of this major version can have: ABI 1.0's fields.
    static let minimumSize = Field.modules.end

    init(_ pointer: UnsafeRawPointer) throws(DescriptorProblem) {
        let raw = ABIStruct<Layout>(pointer)
        let rebuild = "rebuild the plugin against this host's modulehost.h (MODHOST_PLUGIN_INIT sets struct_size)"
        // abi_major sits right after struct_size in every major version: read it first, so a
        // plugin of another major is told so rather than that its struct has another size.
        guard let major = raw.uint32(Field.abiMajor) else {
            throw DescriptorProblem(check: .abi, problem: "the plugin descriptor's struct_size is \(raw.size) bytes, too small to hold its ABI version (ABI \(HostSDK.abiMajor).0 descriptors have at least \(Self.minimumSize))", fix: rebuild)
        }
        guard major == UInt32(MODHOST_ABI_MAJOR) else {
            let minor = raw.uint32(Field.abiMinor).map { ".\($0)" } ?? ""
            throw DescriptorProblem(check: .abi, problem: "the descriptor says ABI \(major)\(minor), this host provides \(HostSDK.abiMajor).\(HostSDK.abiMinor)", fix: rebuild)
        }
        guard raw.size >= Self.minimumSize, raw.size <= ABIStruct<Layout>.hostSize,
              let minor = raw.uint32(Field.abiMinor), let count = raw.uint32(Field.moduleCount), raw.has(Field.modules)
        else {
            let bound = raw.size < Self.minimumSize ? "ABI \(HostSDK.abiMajor).0 descriptors have at least \(Self.minimumSize) (through modules)"
                : "ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor) descriptors have at most \(ABIStruct<Layout>.hostSize)"
            throw DescriptorProblem(check: .abi, problem: "the plugin descriptor's struct_size is \(raw.size) bytes, \(bound)", fix: rebuild)
        }
        guard minor <= UInt32(MODHOST_ABI_MINOR) else {
            throw DescriptorProblem(check: .abi, problem: "the descriptor says ABI \(major).\(minor), this host provides \(HostSDK.abiMajor).\(HostSDK.abiMinor)",
                                    fix: "rebuild the plugin against this host's modulehost.h, or upgrade the host")
        }
        guard let name = raw.pointer(Field.name) else {
            throw DescriptorProblem(check: .descriptor, problem: "the plugin descriptor's name is NULL", fix: "set the plugin's name in its descriptor")
        }
        abiMajor = major
        abiMinor = minor
        self.name = String(cString: name.assumingMemoryBound(to: CChar.self))
        moduleCount = Int(count)
        modules = raw.pointer(Field.modules)
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
            throw DescriptorProblem(check: .descriptor, problem: "module descriptors are \(stride) bytes, "
                                    + (stride < minimum ? "ABI \(HostSDK.abiMajor).0 needs at least \(minimum) (through version)"
                                        : "ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor) needs at most \(maximum)"),
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
