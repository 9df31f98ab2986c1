#!/usr/bin/env python3
"""check-openapi.py - keeps openapi.yaml honest about batond.

Checks, each counted as passed or failed:
  - openapi.yaml parses as YAML, says `openapi: 3.0.3`, and has info.title, info.version
    and paths;
  - every $ref in it resolves to a node of the document (only local "#/..." refs);
  - the set of (method, path) it describes equals the routes table of server/routes.c
    (its `{"GET", "/workflows/{id}", handler},` lines, each GET also serving HEAD), each
    missing or extra operation named;
  - every path parameter of every operation is declared (in: path, required: true);
  - every error response (4xx/5xx) is application/problem+json, every 201 has a Location
    header and every 405 an Allow header;
  - every HTTP status the server code can produce (reply_problem(out, NNN, ...) calls and
    the status table of server/http.c) is documented by at least one operation;
  - every example (media type, parameter, header and schema examples) validates against
    its schema (a small OpenAPI 3.0 schema validator: type, nullable, enum, properties,
    required, additionalProperties, items, min/max, lengths, pattern, allOf/oneOf/anyOf),
    and every `data:` line of a text/event-stream example is a valid Event;
  - the validator refuses a value outside a schema's pattern;
  - with a batond binary ($BATOND, as make test sets it, or --batond), the answers of a
    real batond on a temporary database (workflows and their pages, resources and theirs,
    a lease's life, a 404, /healthz, /nodes) have documented statuses and validate
    against their documented schemas, patterns included.

Prints one line per check and a closing line "N passed, N failed"; exits 1 when a check
failed, 2 when the inputs cannot be read at all.

Usage: scripts/check-openapi.py [--spec FILE] [--routes FILE] [--server-dir DIR] [--batond BIN]
(defaults: openapi.yaml, server/routes.c and server/ at the repository root).
Needs python3 and PyYAML (Debian: python3-yaml) only.
"""
import argparse
import glob
import json
import os
import re
import sys

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.stderr.write("check-openapi: PyYAML is missing (Debian: apt-get install python3-yaml)\n")
    sys.exit(2)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, name):
        self.passed += 1
        print(f"ok   {name}")

    def fail(self, name, problems):
        self.failed += 1
        print(f"FAIL {name}")
        for p in problems:
            print(f"     - {p}")

    def check(self, name, problems):
        if problems:
            self.fail(name, problems)
        else:
            self.ok(name)
        return not problems


# ---- YAML loading: plain data, and timestamps stay strings (JSON has no dates) ----

class _Loader(yaml.SafeLoader):
    pass


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_spec(path):
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_Loader)


# ---- $ref ----

def walk(node, where="#"):
    """Yields (json-pointer, node) for every mapping in the document."""
    if isinstance(node, dict):
        yield where, node
        for k, v in node.items():
            yield from walk(v, f"{where}/{str(k).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{where}/{i}")


_MISSING = object()


def resolve_pointer(doc, ref):
    if not isinstance(ref, str) or not ref.startswith("#"):
        return _MISSING
    node = doc
    if ref in ("#", "#/"):
        return node
    if not ref.startswith("#/"):
        return _MISSING
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def deref(doc, node, seen=None):
    seen = seen or set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            raise ValueError(f"$ref cycle at {ref}")
        seen.add(ref)
        node = resolve_pointer(doc, ref)
        if node is _MISSING:
            raise ValueError(f"unresolved $ref {ref}")
    return node


# ---- routes.c ----

ROUTE_RE = re.compile(r'\{\s*"([A-Z]+)"\s*,\s*"(/[^"]*)"\s*,\s*([A-Za-z_]\w*)\s*\}')


def parse_routes(path):
    """The (METHOD, path) pairs of the routes[] table, in order."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"\broutes\s*\[\s*\]\s*=\s*\{(.*?)\n\s*\}\s*;", text, re.S)
    if not m:
        raise ValueError(f"{path}: no `routes[] = {{ ... }};` table found")
    return [(meth, pat) for meth, pat, _ in ROUTE_RE.findall(m.group(1))]


# ---- a small OpenAPI 3.0 schema validator, for the examples ----

def _type_ok(t, v):
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    return False


def validate(doc, schema, value, where, errors, depth=0):
    """Appends to errors every way value fails schema (OpenAPI 3.0 semantics)."""
    if depth > 64:
        errors.append(f"{where}: schema nesting too deep")
        return
    try:
        schema = deref(doc, schema)
    except ValueError as e:
        errors.append(f"{where}: {e}")
        return
    if not isinstance(schema, dict):
        return
    if value is None:
        # nullable applies to the schema that declares it; allOf/oneOf members of a
        # nullable schema are not consulted for null.
        if schema.get("nullable") is True:
            return
        if any(k in schema for k in ("type", "properties", "enum", "allOf", "oneOf", "anyOf")):
            errors.append(f"{where}: null is not allowed")
        return
    t = schema.get("type")
    if t is not None and not _type_ok(t, value):
        errors.append(f"{where}: expected {t}, got {type(value).__name__} {value!r:.60}")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r:.60} is not one of {schema['enum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{where}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: {value!r:.60} does not match {schema['pattern']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {value} > maximum {schema['maximum']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{where}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                validate(doc, schema["items"], item, f"{where}[{i}]", errors, depth + 1)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required member {name!r}")
        for name, v in value.items():
            if name in props:
                validate(doc, props[name], v, f"{where}.{name}", errors, depth + 1)
            else:
                extra = schema.get("additionalProperties", True)
                if extra is False:
                    errors.append(f"{where}: member {name!r} is not allowed")
                elif isinstance(extra, dict):
                    validate(doc, extra, v, f"{where}.{name}", errors, depth + 1)
    for sub in schema.get("allOf", []):
        validate(doc, sub, value, where, errors, depth + 1)
    for key in ("oneOf", "anyOf"):
        if key not in schema:
            continue
        results = []
        for sub in schema[key]:
            e = []
            validate(doc, sub, value, where, e, depth + 1)
            results.append((sub, e))
        matches = sum(1 for _, e in results if not e)
        if (key == "oneOf" and matches == 1) or (key == "anyOf" and matches >= 1):
            continue
        if matches:
            errors.append(f"{where}: matches {matches} of the {key} schemas, not exactly 1")
            continue
        # None matched: say why, preferring the schema the discriminator names.
        why = min(results, key=lambda r: (": expected " in r[1][0], len(r[1])))
        disc = schema.get("discriminator") or {}
        if isinstance(value, dict) and disc.get("propertyName") in value:
            target = (disc.get("mapping") or {}).get(value[disc["propertyName"]])
            named = [r for r in results if isinstance(r[0], dict) and r[0].get("$ref") == target]
            if not named:
                errors.append(f"{where}: {disc['propertyName']} {value[disc['propertyName']]!r} "
                              f"names none of the {key} schemas")
                continue
            why = named[0]
        label = why[0].get("$ref", "").rsplit("/", 1)[-1] if isinstance(why[0], dict) else ""
        errors.append(f"{where}: matches none of the {key} schemas"
                      + (f" (as {label}: {why[1][0]})" if why[1] else ""))


def schema_examples(doc, schema, where, seen):
    """Yields (where, schema, example) for `example` in a schema tree (components once)."""
    if isinstance(schema, dict) and "$ref" in schema:
        return
    if not isinstance(schema, dict) or id(schema) in seen:
        return
    seen.add(id(schema))
    if "example" in schema:
        yield where, schema, schema["example"]
    for name, sub in (schema.get("properties") or {}).items():
        yield from schema_examples(doc, sub, f"{where}.properties.{name}", seen)
    if isinstance(schema.get("items"), dict):
        yield from schema_examples(doc, schema["items"], f"{where}.items", seen)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from schema_examples(doc, schema["additionalProperties"],
                                   f"{where}.additionalProperties", seen)
    for key in ("allOf", "oneOf", "anyOf"):
        for i, sub in enumerate(schema.get(key) or []):
            yield from schema_examples(doc, sub, f"{where}.{key}[{i}]", seen)


def all_examples(doc):
    """Yields (where, schema, example) for every example of the document."""
    seen = set()
    for ptr, node in walk(doc):
        # media type objects: a "schema" beside "example" or "examples"; parameters and
        # headers have the same shape.
        if "schema" in node and ("example" in node or "examples" in node):
            schema = node["schema"]
            if "example" in node:
                yield f"{ptr}/example", schema, node["example"]
            for name, ex in (node.get("examples") or {}).items():
                try:
                    ex = deref(doc, ex)
                except ValueError:
                    continue  # reported by the $ref check
                if isinstance(ex, dict) and "value" in ex:
                    yield f"{ptr}/examples/{name}", schema, ex["value"]
    for name, schema in ((doc.get("components") or {}).get("schemas") or {}).items():
        yield from schema_examples(doc, schema, f"#/components/schemas/{name}", seen)


# ---- live answers: a real batond, its answers validated against the document ----

def template_of(paths, path):
    """The path template of openapi.yaml that a concrete path (no query) matches, or None."""
    for tpl in paths:
        rx = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(tpl)) + "$"
        if re.match(rx, path):
            return tpl
    return None


def response_schema(doc, method, path, status):
    """The schema openapi.yaml gives the answer to METHOD path with status; None when the
    answer has no body; raises ValueError when the answer is not documented."""
    tpl = template_of(doc.get("paths") or {}, path.split("?", 1)[0])
    if tpl is None:
        raise ValueError(f"{path}: no path of openapi.yaml matches")
    op = (doc["paths"][tpl] or {}).get(method.lower())
    if not isinstance(op, dict):
        raise ValueError(f"{method} {tpl} is not documented")
    resp = (op.get("responses") or {}).get(str(status))
    if resp is None:
        raise ValueError(f"{method} {tpl}: status {status} is not documented")
    content = deref(doc, resp).get("content") or {}
    for media in ("application/json", "application/problem+json"):
        if media in content:
            return content[media].get("schema")
    return None


class Batond:
    """batond on 127.0.0.1, port 0, with a database in a temporary directory; stopped by
    its pid (SIGTERM, then SIGKILL) by stop(), which the caller runs in a finally."""

    def __init__(self, binary):
        import subprocess
        import tempfile
        import time
        self.dir = tempfile.mkdtemp(prefix="baton-openapi-")
        self.log = open(os.path.join(self.dir, "batond.log"), "w+")
        self.proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--db",
                                      os.path.join(self.dir, "baton.db")],
                                     stdout=self.log, stderr=self.log)
        self.url = None
        deadline = time.monotonic() + 60
        while self.url is None and time.monotonic() < deadline and self.proc.poll() is None:
            self.log.seek(0)
            m = re.search(r"listening on (http://[^ /]*:\d+)", self.log.read())
            if m:
                self.url = m.group(1)
            else:
                time.sleep(0.05)
        if self.url is None:
            self.stop()
            raise RuntimeError("batond did not say where it listens")

    def call(self, method, path, body=None):
        """(status, parsed JSON body or None)."""
        import urllib.error
        import urllib.request
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        return status, json.loads(raw) if raw else None

    def stop(self):
        import shutil
        import subprocess
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def live_answers(doc, server):
    """Asks server what a user would, and returns the problems of each answer against
    the document: its status documented, its body valid against the documented schema
    (types, required members, patterns...)."""
    problems, n = [], 0

    def ask(method, path, body=None, want=None):
        nonlocal n
        n += 1
        status, answer = server.call(method, path, body)
        where = f"{method} {path} ({status})"
        if want is not None and status != want:
            problems.append(f"{where}: expected {want}")
        try:
            schema = response_schema(doc, method, path, status)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            return answer
        if schema is not None:
            errs = []
            validate(doc, schema, answer, "answer", errs)
            problems.extend(f"{where}: {e}" for e in errs[:5])
        return answer

    for i in range(3):
        ask("POST", "/workflows", {"id": f"live-{i}", "resource": "live-r", "workers": ["a", "b"]}, 201)
    page = ask("GET", "/workflows?limit=1", want=200) or {}
    if not page.get("next_cursor"):
        problems.append("GET /workflows?limit=1: no next_cursor with 3 workflows")
    else:
        ask("GET", "/workflows?limit=1&cursor=" + page["next_cursor"], want=200)
    ask("GET", "/workflows/live-0", want=200)
    ask("GET", "/workflows/nope", want=404)
    lease = ask("POST", "/resources/live-l/leases", {"holder": "h", "ttl_ms": 60000}, 201) or {}
    ask("POST", "/resources/live-m/leases", {"holder": "h", "ttl_ms": 60000}, 201)
    res = ask("GET", "/resources?limit=1", want=200) or {}
    if res.get("next_cursor"):
        ask("GET", "/resources?limit=1&cursor=" + res["next_cursor"], want=200)
    ask("GET", "/resources/live-l", want=200)
    if lease.get("id"):
        ask("GET", "/leases/" + lease["id"], want=200)
        ask("POST", "/leases/" + lease["id"] + "/renew", want=200)
        ask("DELETE", "/leases/" + lease["id"], want=204)
    ask("GET", "/healthz", want=200)
    ask("GET", "/nodes")
    return problems, n


# ---- the checks ----

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "openapi.yaml"))
    ap.add_argument("--routes", default=os.path.join(ROOT, "server", "routes.c"))
    ap.add_argument("--server-dir", default=None,
                    help="C sources whose reply_problem statuses must be documented "
                         "(default: the directory of --routes)")
    ap.add_argument("--batond", default=os.environ.get("BATOND") or None,
                    help="a batond binary to start on a temporary database and whose "
                         "answers are validated (default: $BATOND; none: no live check)")
    args = ap.parse_args(argv)
    server_dir = args.server_dir or os.path.dirname(os.path.abspath(args.routes))
    c = Checks()

    # 1. parse and version
    try:
        doc = load_spec(args.spec)
    except (OSError, yaml.YAMLError) as e:
        c.fail(f"{args.spec} parses as YAML", [str(e)])
        print(f"{c.passed} passed, {c.failed} failed")
        return 2
    c.ok(f"{os.path.relpath(args.spec)} parses as YAML")
    if not isinstance(doc, dict):
        c.fail("the document is a mapping", [f"got {type(doc).__name__}"])
        print(f"{c.passed} passed, {c.failed} failed")
        return 1
    problems = []
    if doc.get("openapi") != "3.0.3":
        problems.append(f"openapi is {doc.get('openapi')!r}, not '3.0.3'")
    info = doc.get("info")
    if not isinstance(info, dict) or not info.get("title") or not info.get("version"):
        problems.append("info.title and info.version are required")
    if not isinstance(doc.get("paths"), dict) or not doc["paths"]:
        problems.append("paths is missing or empty")
    c.check("openapi: 3.0.3 with info and paths", problems)
    paths = doc.get("paths") if isinstance(doc.get("paths"), dict) else {}

    # 2. $refs
    problems, nrefs = [], 0
    for ptr, node in walk(doc):
        if "$ref" in node:
            nrefs += 1
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                problems.append(f"{ptr}: $ref {ref!r} is not a local reference")
            elif resolve_pointer(doc, ref) is _MISSING:
                problems.append(f"{ptr}: $ref {ref!r} does not resolve")
    mapping_refs = 0
    for ptr, node in walk(doc):
        disc = node.get("discriminator")
        if isinstance(disc, dict):
            for key, ref in (disc.get("mapping") or {}).items():
                mapping_refs += 1
                if resolve_pointer(doc, ref) is _MISSING:
                    problems.append(f"{ptr}/discriminator/mapping/{key}: {ref!r} does not resolve")
    c.check(f"every $ref resolves ({nrefs} refs, {mapping_refs} discriminator mappings)", problems)

    # 3. routes
    try:
        routes = parse_routes(args.routes)
    except (OSError, ValueError) as e:
        c.fail(f"{os.path.relpath(args.routes)} has a routes table", [str(e)])
        routes = None
    if routes is not None:
        problems = []
        if not routes:
            problems.append(f"{args.routes}: the routes table has no entries")
        dups = {r for r in routes if routes.count(r) > 1}
        problems += [f"{m} {p} appears more than once in the routes table" for m, p in sorted(dups)]
        c.check(f"{os.path.relpath(args.routes)} routes table parsed ({len(routes)} routes)", problems)
        code = set(routes)
        # batond serves HEAD wherever it serves GET (server/routes.c: route_lookup).
        code |= {("HEAD", p) for m, p in routes if m == "GET"}
        spec = set()
        for p, item in paths.items():
            if isinstance(item, dict):
                for m in item:
                    if m in METHODS:
                        spec.add((m.upper(), p))
        problems = [f"{m} {p}: in the routes table, missing from openapi.yaml"
                    for m, p in sorted(code - spec)]
        problems += [f"{m} {p}: in openapi.yaml, not in the routes table"
                     for m, p in sorted(spec - code)]
        c.check(f"operations of openapi.yaml == routes table ({len(spec)} vs {len(code)})", problems)

    # 4. path parameters
    problems = []
    for p, item in paths.items():
        if not isinstance(item, dict):
            problems.append(f"{p}: not a path item")
            continue
        wanted = set(re.findall(r"\{([^}]+)\}", p))
        for m, op in item.items():
            if m not in METHODS:
                continue
            declared = {}
            for prm in (item.get("parameters") or []) + (op.get("parameters") or []):
                try:
                    prm = deref(doc, prm)
                except ValueError:
                    continue
                if isinstance(prm, dict):
                    declared[(prm.get("name"), prm.get("in"))] = prm
            for name in sorted(wanted):
                prm = declared.get((name, "path"))
                if prm is None:
                    problems.append(f"{m.upper()} {p}: path parameter {name!r} is not declared")
                elif prm.get("required") is not True:
                    problems.append(f"{m.upper()} {p}: path parameter {name!r} must be required")
            for (name, where) in declared:
                if where == "path" and name not in wanted:
                    problems.append(f"{m.upper()} {p}: path parameter {name!r} is not in the path")
            if not op.get("responses"):
                problems.append(f"{m.upper()} {p}: no responses")
    c.check("path parameters declared, every operation has responses", problems)

    # 5. response conventions
    problems, documented = [], set()
    for p, item in paths.items():
        if not isinstance(item, dict):
            continue
        for m, op in item.items():
            if m not in METHODS or not isinstance(op, dict):
                continue
            for status, resp in (op.get("responses") or {}).items():
                status = str(status)
                documented.add(status)
                try:
                    resp = deref(doc, resp)
                except ValueError:
                    continue
                if not isinstance(resp, dict):
                    continue
                name = f"{m.upper()} {p} {status}"
                content = resp.get("content") or {}
                if status[0] in "45" and set(content) != {"application/problem+json"}:
                    problems.append(f"{name}: error bodies must be application/problem+json only")
                headers = {k.lower() for k in (resp.get("headers") or {})}
                if status == "201" and "location" not in headers:
                    problems.append(f"{name}: no Location header")
                if status == "405" and "allow" not in headers:
                    problems.append(f"{name}: no Allow header")
    c.check("error responses are problem+json, 201 has Location, 405 has Allow", problems)

    # 6. statuses the code produces
    problems = []
    produced = set()
    for src in sorted(glob.glob(os.path.join(server_dir, "*.c"))):
        with open(src, encoding="utf-8") as f:
            text = f.read()
        produced |= set(re.findall(r"reply_problem\(\s*&?\w+\s*,\s*(\d{3})\b", text))
        table = re.search(r"status_of\[\]\s*=\s*\{(.*?)\};", text, re.S)
        if table:
            produced |= set(re.findall(r"=\s*(\d{3})\b", table.group(1)))
    produced.discard("200")
    for s in sorted(produced - documented):
        problems.append(f"status {s} is produced by the code in {os.path.relpath(server_dir)}/ "
                        "but documented by no operation")
    c.check(f"every status the server code produces is documented ({', '.join(sorted(produced))})",
            problems)

    # 7. examples
    problems, n = [], 0
    event = {"$ref": "#/components/schemas/Event"}
    for where, schema, example in all_examples(doc):
        n += 1
        errs = []
        validate(doc, schema, example, "example", errs)
        # An event stream's `data:` lines are events: they must be valid Events too.
        if "/text~1event-stream/" in where + "/" and isinstance(example, str) \
                and resolve_pointer(doc, event["$ref"]) is not _MISSING:
            for i, line in enumerate(example.splitlines()):
                if line.startswith("data:"):
                    try:
                        data = json.loads(line[5:])
                    except ValueError as e:
                        errs.append(f"line {i + 1}: data is not JSON: {e}")
                        continue
                    validate(doc, event, data, f"line {i + 1} data", errs)
        problems += [f"{where}: {e}" for e in errs[:5]]
    c.check(f"every example validates against its schema ({n} examples)", problems)

    # 8. live answers (BATOND, as make test sets it, or --batond)
    problems = []
    bad = {"workflows": [], "next_cursor": "#not-a-cursor"}
    validate(doc, {"$ref": "#/components/schemas/WorkflowList"}, bad, "answer", problems)
    c.check("the validator checks patterns (a cursor outside WorkflowList's is refused)",
            [] if problems else ["next_cursor '#not-a-cursor' passed"])
    if args.batond:
        problems, n, server = [], 0, None
        try:
            server = Batond(args.batond)
            problems, n = live_answers(doc, server)
        except (OSError, RuntimeError, ValueError) as e:
            problems.append(str(e))
        finally:
            if server:
                server.stop()
        c.check(f"batond's answers validate against openapi.yaml ({n} requests)", problems)

    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
