#!/usr/bin/env python3
"""tests/docker/compose-args.py - the `run` arguments of one service of a compose file.

tests/docker/run.sh starts the cluster of docker/cluster.yaml once with the compose tool
(podman-compose or docker compose) and once container by container, from what the file
says, not from a copy of it, so that it can kill one node and wait for health itself:

  compose-args.py [--set NAME=VALUE]... [--volume-prefix P] [--image DOCKERFILE=IMAGE]...
                  COMPOSE_FILE SERVICE

prints, NUL-separated, the arguments for `podman run -d --name ... --network ...`:
--network-alias SERVICE, -e NAME=VALUE for its environment (interpolated as compose
does, from the --set variables only: everything else counts as unset; a name without a
value is passed only when it is set), --read-only,
--tmpfs, --cap-drop, --security-opt, --stop-timeout (stop_grace_period), -v for named
volumes (renamed P-NAME), -p 127.0.0.1::PORT for each published port, and last the
image: the one given for the Dockerfile the service builds (a path relative to the
repository, e.g. docker/Dockerfile). A published port on anything but 127.0.0.1, a key
it does not know, or a ${...} form it does not know is an error (exit 1), so that the
test cannot silently run something else than the file. `restart:` and `depends_on:` are
left to the caller (run.sh kills a node on purpose and waits for health itself).
"""
import os
import re
import sys

import yaml

KNOWN = {"build", "image", "profiles", "restart", "depends_on", "ports", "environment",
         "volumes", "stop_grace_period", "read_only", "tmpfs", "cap_drop", "security_opt"}


def fail(msg):
    print(f"compose-args.py: {msg}", file=sys.stderr)
    sys.exit(1)


def interpolate(value, env):
    """${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME}, $NAME and $$, as compose
    reads them."""
    def one(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, default = m.group("op"), m.group("default") or ""
        if m.group("braced") and m.group("rest") and not op:
            fail(f"unsupported interpolation {m.group(0)!r}")
        val = env.get(name)
        if op == ":-":
            return val if val else default
        if op == "-":
            return val if val is not None else default
        if op == ":?":
            if not val:
                fail(f"{name} is required: {default}")
            return val
        return val or ""

    pat = re.compile(r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<rest>(?P<op>:-|-|:\?)"
                     r"(?P<default>[^}]*)|[^}]*)\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")
    out = pat.sub(one, str(value))
    if "${" in out:
        fail(f"unsupported interpolation in {value!r}")
    return out


def seconds(duration):
    m = re.fullmatch(r"(\d+)(s|m)?", str(duration))
    if not m:
        fail(f"stop_grace_period {duration!r}: only Ns or Nm")
    return str(int(m.group(1)) * (60 if m.group(2) == "m" else 1))


def main(argv):
    env, images, prefix, pos = {}, {}, "", []
    it = iter(argv)
    for a in it:
        if a == "--set":
            k, _, v = next(it).partition("=")
            env[k] = v
        elif a == "--image":
            k, _, v = next(it).partition("=")
            images[os.path.normpath(k)] = v
        elif a == "--volume-prefix":
            prefix = next(it)
        else:
            pos.append(a)
    if len(pos) != 2:
        fail(__doc__.split("\n\n")[1])
    path, name = pos
    doc = yaml.safe_load(open(path))
    svc = doc.get("services", {}).get(name)
    if svc is None:
        fail(f"no service {name} in {path}")
    unknown = set(svc) - KNOWN
    if unknown:
        fail(f"service {name}: keys this test does not translate: {sorted(unknown)}")

    args = ["--network-alias", name]
    env_of = svc.get("environment") or {}
    if isinstance(env_of, list):
        env_of = dict((e.split("=", 1) + [""])[:2] for e in env_of)
    for k, v in env_of.items():
        if v is None:
            if k in env:
                args += ["-e", f"{k}={env[k]}"]
        else:
            args += ["-e", f"{k}={interpolate(v, env)}"]
    if svc.get("read_only"):
        args.append("--read-only")
    for t in svc.get("tmpfs") or []:
        args += ["--tmpfs", t]
    for c in svc.get("cap_drop") or []:
        args += ["--cap-drop", c]
    for o in svc.get("security_opt") or []:
        args += ["--security-opt", o]
    if "stop_grace_period" in svc:
        args += ["--stop-timeout", seconds(svc["stop_grace_period"])]
    for v in svc.get("volumes") or []:
        src, _, dst = str(v).partition(":")
        if src not in (doc.get("volumes") or {}):
            fail(f"service {name}: volume {v!r} is not a named volume of the file")
        args += ["-v", f"{prefix}{src}:{dst}"]
    for p in svc.get("ports") or []:
        parts = interpolate(p, env).split(":")
        if len(parts) != 3 or parts[0] != "127.0.0.1":
            fail(f"service {name}: port {p!r} is not published on 127.0.0.1 only")
        args += ["-p", f"127.0.0.1::{parts[2]}"]

    build = svc.get("build") or {}
    base = os.path.dirname(os.path.abspath(path))
    ctx = os.path.join(base, build.get("context", "."))
    dockerfile = os.path.join(ctx, build.get("dockerfile", "Dockerfile"))
    rel = os.path.normpath(os.path.relpath(dockerfile, os.path.join(base, "..")))
    if rel not in images:
        fail(f"service {name} builds {rel}; no --image given for it")
    args.append(images[rel])
    sys.stdout.write("\0".join(args) + "\0")


main(sys.argv[1:])
