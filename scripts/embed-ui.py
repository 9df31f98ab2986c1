#!/usr/bin/env python3
"""embed-ui.py - turns the console's files into C for batond (server/ui.h).

    embed-ui.py OUT.c FILE...

Each FILE becomes a byte array with its name (the base name: served as /ui/NAME), its
content type (from its extension) and an ETag (a quoted hash of its bytes), as `xxd -i`
would, so that batond carries the console and serves it without reading a file.
"""
import hashlib
import os
import sys

TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
}


def main():
    if len(sys.argv) < 3:
        sys.stderr.write("usage: embed-ui.py OUT.c FILE...\n")
        return 2
    out, files = sys.argv[1], sorted(sys.argv[2:], key=os.path.basename)
    lines = ["/* Written by scripts/embed-ui.py from ui/ at build time: do not edit. */",
             '#include "ui.h"', ""]
    table = []
    for i, path in enumerate(files):
        name = os.path.basename(path)
        ext = os.path.splitext(name)[1]
        if ext not in TYPES:
            sys.stderr.write("embed-ui: %s: no content type for %s files\n" % (path, ext))
            return 1
        with open(path, "rb") as f:
            data = f.read()
        etag = '"%s"' % hashlib.sha256(data).hexdigest()[:20]
        lines.append("static const unsigned char f%d[] = {" % i)
        for off in range(0, len(data), 16):
            lines.append("\t" + ", ".join("0x%02x" % b for b in data[off:off + 16]) + ",")
        lines.append("\t0x00};")
        table.append('\t{"%s", "%s", f%d, %d, "%s"},' % (name, TYPES[ext], i, len(data),
                                                         etag.replace('"', '\\"')))
    lines.append("")
    lines.append("const ui_file ui_files[] = {")
    lines.extend(table)
    lines.append("};")
    lines.append("const size_t ui_nfiles = %d;" % len(table))
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
