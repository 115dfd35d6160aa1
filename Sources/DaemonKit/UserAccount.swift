import Glibc

/// An account of the user database, looked up as a login looks it up: its uid, its primary
/// group, and the groups that list it as a member. The reentrant calls are used, so any
/// thread may look one up.
public struct UserAccount: Sendable, Equatable {
    public let name: String
    public let uid: uid_t
    /// Its primary group (the `passwd` entry's).
    public let gid: gid_t

    /// The account named `user`, or whose uid `user` is when it is all digits; nil when the
    /// user database has none.
    public static func lookUp(_ user: String) -> UserAccount? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16384)
        return buffer.withUnsafeMutableBufferPointer { raw -> UserAccount? in
            let status: Int32
            if let number = UInt32(user) {
                status = getpwuid_r(number, &entry, raw.baseAddress!, raw.count, &result)
            } else {
                status = getpwnam_r(user, &entry, raw.baseAddress!, raw.count, &result)
            }
            guard status == 0, result != nil, let name = entry.pw_name else { return nil }
            return UserAccount(name: String(cString: name), uid: entry.pw_uid, gid: entry.pw_gid)
        }
    }

    /// The gid of `group`: the number when it is all digits, else the group of that name in
    /// the group database; nil when there is none.
    public static func groupID(_ group: String) -> gid_t? {
        if let number = UInt32(group) { return number }
        var entry = Glibc.group()
        var result: UnsafeMutablePointer<Glibc.group>?
        var buffer = [CChar](repeating: 0, count: 16384)
        let status = getgrnam_r(group, &entry, &buffer, buffer.count, &result)
        return status == 0 && result != nil ? entry.gr_gid : nil
    }

    /// The groups a process of this account has with `primary` as its group, as
    /// `initgroups` would give it: `primary` first, then every group that lists the account
    /// as a member.
    public func groups(primary: gid_t) -> [gid_t] {
        var count: Int32 = 64
        while true {
            var list = [gid_t](repeating: 0, count: Int(count))
            let wanted = count
            if getgrouplist(name, primary, &list, &count) >= 0 {
                let members = list.prefix(Int(count)).filter { $0 != primary }
                return [primary] + members
            }
            // Too small: `count` now says how many there are.
            guard count > wanted, count < 65536 else { return [primary] }
        }
    }
}
