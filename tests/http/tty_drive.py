# tty_drive.py MODE BATON URL DIR - used by tests/http/test_tty.c: runs
# `BATON --server URL lock db --ttl 2s -- sh -c ...` on a new pseudo-terminal as a shell
# runs a foreground job (this process is the session leader, baton lock its own group,
# given the terminal), types at it, and prints what it saw as one JSON object.
# MODE: line (a line read by the command), intr (Ctrl-C during `sleep 30`), stop (Ctrl-Z,
# six seconds stopped, then `fg` and a line), kill (Ctrl-Z, then `kill %1`). And for
# `BATON worker --worker tw --once --ttl 2s -- sh -c ...` (a task of workflow w1 waits):
# wstop (Ctrl-Z while the command runs, six seconds stopped, then `fg`; the command ends
# once DIR/go exists) and wquit (Ctrl-\ during `sleep 30`). Pids go to DIR/baton.pid and
# DIR/cmd.pid; everything is bounded by 60 s and killed on failure.
import fcntl, json, os, select, signal, sys, termios, time, urllib.request

mode, baton, url, d = sys.argv[1:5]
seen, out = b"", {"mode": mode}
start = time.monotonic()
pid = 0


def pid_of(name):
    try:
        with open(os.path.join(d, name)) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def holder():
    with urllib.request.urlopen(url + "/resources/db", timeout=10) as r:
        h = json.load(r).get("holder")
    return h.get("lease_id") if isinstance(h, dict) else None


def pump(master, until, text):
    global seen
    while text.encode() not in seen:
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError("no %r in %r" % (text, seen.decode(errors="replace")))
        if select.select([master], [], [], min(left, 0.2))[0]:
            try:
                seen += os.read(master, 4096)
            except OSError:
                pass


def get(path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.load(r)


def wait_file(name, until):
    while not os.path.exists(os.path.join(d, name)):
        if time.monotonic() > until:
            raise TimeoutError("no %s" % name)
        time.sleep(0.05)


def state_of(p):
    with open("/proc/%d/stat" % p) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def stopped_state(p, until):
    """The state of p once it shows stopped (T), or the last one seen at `until`: a
    process the stop reached in uninterruptible sleep (D) shows T once it wakes."""
    st = state_of(p)
    while st != "T" and time.monotonic() < until:
        time.sleep(0.02)
        st = state_of(p)
    return st


def alive(p):
    try:
        os.kill(p, 0)
        return state_of(p) != "Z"
    except OSError:
        return False


def stay_stopped(slave, ws, key):
    """The job stopped (ws): the shell takes its terminal back, notes whether the job and
    its command are stopped, and waits three ttls, after which the lease or the claim had
    run out unless something kept it."""
    out[key] = os.WIFSTOPPED(ws)
    os.tcsetpgrp(slave, os.getpgrp())
    out["cmd_state"] = stopped_state(pid_of("cmd.pid"), time.monotonic() + 10)
    t = time.monotonic()
    while time.monotonic() < t + 6:
        time.sleep(0.2)


def fg(slave):
    os.tcsetpgrp(slave, pid)
    os.killpg(pid, signal.SIGCONT)


def wait_pid(flags, until):
    while time.monotonic() < until:
        w, ws = os.waitpid(pid, flags | os.WNOHANG)
        if w == pid:
            return ws
        time.sleep(0.02)
    raise TimeoutError("baton lock did not change state")


def run(master, slave):
    global pid
    sh = {"line": 'echo $$ > %s/cmd.pid; echo ready; read x; echo "got $x"',
          "intr": "echo $$ > %s/cmd.pid; echo ready; sleep 30",
          "stop": 'echo $$ > %s/cmd.pid; echo ready; read x; echo "got $x"',
          "kill": 'echo $$ > %s/cmd.pid; echo ready; read x; echo "got $x"',
          "wstop": "echo $$ > {0}/cmd.pid; touch {0}/ready; "
                   "while [ ! -e {0}/go ]; do sleep 0.1; done; echo done",
          "wquit": "echo $$ > {0}/cmd.pid; touch {0}/ready; sleep 30"}[mode]
    sh = sh.format(d) if mode.startswith("w") else sh % d
    args = [baton, "--server", url, "lock", "db", "--ttl", "2s", "--", "sh", "-c", sh]
    if mode.startswith("w"):
        args = [baton, "--server", url, "worker", "--worker", "tw", "--once", "--ttl", "2s",
                "--", "sh", "-c", sh]
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.tcsetpgrp(slave, os.getpid())
        for s in (signal.SIGTTOU, signal.SIGPIPE, signal.SIGINT, signal.SIGQUIT):
            signal.signal(s, signal.SIG_DFL)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        os.execv(baton, args)
    with open(os.path.join(d, "baton.pid"), "w") as f:
        f.write("%d\n" % pid)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    os.tcsetpgrp(slave, pid)  # a shell's foreground job
    until = start + 60
    if mode.startswith("w"):
        worker(master, slave, until)
        return
    pump(master, until, "ready")
    out["held"] = holder()
    if mode == "line":
        os.write(master, b"hello\n")
    elif mode == "intr":
        os.write(master, b"\x03")
    else:
        os.write(master, b"\x1a")
        out["phase"] = "waiting for baton lock to stop"
        ws = wait_pid(os.WUNTRACED, until)
        out["phase"] = "stopped"
        if mode == "kill":  # as a shell's `kill %1` does to a stopped job
            os.tcsetpgrp(slave, os.getpgrp())
            os.killpg(pid, signal.SIGTERM)
            os.killpg(pid, signal.SIGCONT)
            out["phase"] = "waiting for baton lock to exit"
            out["status"] = os.waitstatus_to_exitcode(wait_pid(0, until))
            pid = -pid
            out["held_after"] = holder()
            return
        stay_stopped(slave, ws, "baton_stopped")
        out["held_while_stopped"] = holder()
        fg(slave)
        os.write(master, b"hello\n")
    ws = wait_pid(0, until)
    out["status"] = os.waitstatus_to_exitcode(ws)
    pid = -pid  # reaped
    os.tcsetpgrp(slave, os.getpgrp())
    try:
        pump(master, time.monotonic() + 1, "\x00")
    except TimeoutError:
        pass
    out["output"] = seen.decode(errors="replace")
    out["held_after"] = holder()


def worker(master, slave, until):
    global pid
    wait_file("ready", until)
    wait_file("cmd.pid", until)
    if mode == "wquit":
        os.write(master, b"\x1c")
    else:
        os.write(master, b"\x1a")
        out["phase"] = "waiting for baton worker to stop"
        ws = wait_pid(os.WUNTRACED, until)
        stay_stopped(slave, ws, "worker_stopped")
        out["step_while_stopped"] = get("/workflows/w1")["steps"][0]
        fg(slave)
        open(os.path.join(d, "go"), "w").close()
    out["phase"] = "waiting for baton worker to exit"
    out["status"] = os.waitstatus_to_exitcode(wait_pid(0, until))
    pid = -pid
    os.tcsetpgrp(slave, os.getpgrp())
    out["cmd_alive"] = alive(pid_of("cmd.pid"))
    out["step"] = get("/workflows/w1")["steps"][0]


def main():
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    try:
        run(master, slave)
    except Exception as e:
        out["error"] = repr(e)
        out["output"] = seen.decode(errors="replace")
    finally:
        for p, kill in ((pid, os.kill), (pid_of("cmd.pid"), os.killpg)):  # what a failed
            if p > 0:                                                 # run left
                try:
                    kill(p, signal.SIGKILL)
                except OSError:
                    pass
    print(json.dumps(out), flush=True)


main()
