"""The HTML checks of the --suite tests: well formed enough and self-contained."""
import html.parser

VOID = {"meta", "br", "rect", "img", "hr", "link", "input", "col"}


class Checker(html.parser.HTMLParser):
    """Every non-void element closed in order; no external resources, no script."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.tags, self.classes = [], [], {}, {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for name, val in attrs:
            if name in ("src", "href") or (val and "url(" in val):
                self.errors.append(f"external resource: <{tag} {name}={val}>")
            if name == "class":
                self.classes[val] = self.classes.get(val, 0) + 1
        if tag == "script":
            self.errors.append("script element")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for name, val in attrs:
            if name == "class":
                self.classes[val] = self.classes.get(val, 0) + 1

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def parse(path):
    p = Checker()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    p.feed(text)
    p.close()
    return p, text
