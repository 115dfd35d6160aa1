import Foundation

/// One fenced code block of a Markdown document: what tests that check the documents'
/// examples against the code read.
public struct MarkdownBlock: Sendable, Equatable {
    /// The document, relative to the package root (`docs/daemon.md`).
    public var document: String
    /// The line of the opening fence (1-based), for messages.
    public var line: Int
    /// The language tag after the opening fence (`console`, `json`, `c`), or "".
    public var language: String
    /// The lines between the fences, each ending in a newline.
    public var body: String

    /// Where the block is, as `docs/daemon.md:42`.
    public var location: String { "\(document):\(line)" }

    /// The fenced blocks of `document` (a path relative to the package root), in order.
    /// Fences are lines starting with three backticks, possibly indented (blocks inside
    /// list items); the indentation of the opening fence is removed from every line.
    public static func blocks(of document: String) throws -> [MarkdownBlock] {
        let text = try String(contentsOfFile: BuildProducts.packageRoot + "/" + document, encoding: .utf8)
        var blocks: [MarkdownBlock] = []
        var open: (line: Int, language: String, indent: Int, lines: [Substring])?
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let indent = line.prefix { $0 == " " }.count
            let trimmed = line.dropFirst(indent)
            if trimmed.hasPrefix("```") {
                if let block = open {
                    blocks.append(MarkdownBlock(document: document, line: block.line, language: block.language,
                                                body: block.lines.map { $0 + "\n" }.joined()))
                    open = nil
                } else {
                    open = (index + 1, String(trimmed.dropFirst(3)).trimmingCharacters(in: .whitespaces), indent, [])
                }
            } else if open != nil {
                let strip = min(open!.indent, line.prefix { $0 == " " }.count)
                open!.lines.append(line.dropFirst(strip))
            }
        }
        return blocks
    }

    /// The Markdown documents whose examples are checked: README.md and docs/*.md.
    public static func documents() throws -> [String] {
        let names = try FileManager.default.contentsOfDirectory(atPath: BuildProducts.packageRoot + "/docs")
        return ["README.md"] + names.filter { $0.hasSuffix(".md") }.sorted().map { "docs/" + $0 }
    }
}
