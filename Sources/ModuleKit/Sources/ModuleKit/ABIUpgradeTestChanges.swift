// Additions that only the ABI upgrade test compiles in (Tests/ModuleHostTests/
// ABIUpgradeTests.swift): a ModuleKit 1.1 that adds one of each kind of declaration the
// compatibility policy allows (docs/abi.md, "Swift plugin compatibility"). The others are
// inline, where the language needs them: a stored property in ModuleInfo and in Bus, an
// enum case in ModuleEvent, a protocol requirement with a default in Module.
#if MODULEKIT_ABI_TEST_ADDITIONS
/// A new function.
public func abiTestAddedFunction() -> Int { 11 }

/// A new type.
public struct ABITestAddedType: Sendable {
    public var value: Int
    public init(value: Int) { self.value = value }
}

extension Bus {
    /// A new method on an existing class.
    public func abiTestAddedMethod() -> String { "\(label)+" }
}
#endif
