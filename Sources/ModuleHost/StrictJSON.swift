import ModuleKit
import PluginFormat

extension JSONValue {
    /// Parses JSON from outside the daemon with the project's one strict parser
    /// (`JSONTree.parse`): duplicate member names, leading zeros, numbers beyond a double,
    /// invalid UTF-8 and deep nesting are errors with a byte offset.
    init(strict bytes: [UInt8]) throws(JSONSyntaxError) {
        self.init(controlTree: try JSONTree.parse(bytes))
    }
}
