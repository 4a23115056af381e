"""What the end-to-end browser test needs: a private JupyterLab server, Chromium, and a
way to prove that every process the server started (kernels, rank workers) is gone.

Every process the server starts inherits one environment variable,
``DTLAB_E2E_MARKER=<random>``: kernels and the ranks they spawn keep it even
after they are re-parented to init, so a scan of ``/proc/*/environ`` finds all
of them, whoever their parent is now.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
MARKER_VAR = "DTLAB_E2E_MARKER"


def find_chromium() -> str | None:
    """Debian's chromium (never a browser that playwright downloads)."""
    for candidate in (
        os.environ.get("DTLAB_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def browser_unavailable() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    missing = []
    if find_chromium() is None:
        missing.append("chromium (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install playwright)")
    if missing:
        return "browser test needs " + " and ".join(missing) + "; `make test` installs both"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- processes, read from /proc
def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _start_time(pid: int) -> str:
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""  # field 22: starttime


def _alive(pid: int) -> bool:
    """Running (a zombie has already let go of everything and does not count)."""
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] != "Z"


def cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def marked_processes(marker: str) -> dict[int, str]:
    """Live processes whose environment carries ``marker`` -> their command line."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            if needle in _read(f"/proc/{pid}/environ").split(b"\0") and _alive(pid):
                found[pid] = cmdline(pid)
    return found


def descendants(root: int) -> dict[int, str]:
    """Live processes whose parent chain leads to ``root`` -> their command line."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat").decode(errors="replace")
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 1:
                parent[int(entry)] = int(fields[1])
    found = {}
    for pid in parent:
        p = parent.get(pid)
        while p and p != root and p in parent and p != 1:
            p = parent.get(p)
        if p == root and _alive(pid):
            found[pid] = cmdline(pid)
    return found


def kill_all(pids, *, grace_s: float = 5.0) -> None:
    """SIGTERM each (same process: pid and start time checked), then SIGKILL what is left."""
    started = {pid: _start_time(pid) for pid in pids}
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        live = [p for p, st in started.items() if st and _start_time(p) == st and _alive(p)]
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_start_time(p) == started[p] and _alive(p) for p in live):
            time.sleep(0.1)


# -- the server
class JupyterLabServer:
    """``jupyter lab`` on a free loopback port, with its own token and its own
    config, data, runtime and settings folders under ``home`` (the user's
    JupyterLab settings are never read nor written)."""

    def __init__(
        self, notebook_dir: Path, home: Path, *, startup_timeout_s: float = 180.0, python: str = sys.executable
    ):
        self.python = python
        self.notebook_dir = Path(notebook_dir)
        self.home = Path(home)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.marker = secrets.token_hex(8)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = self.home / "jupyterlab.log"
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.seen: dict[int, tuple[str, str]] = {}  # every descendant seen: (start time, cmdline)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        dirs = {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "settings",
            "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
            "IPYTHONDIR": "ipython",
        }
        for var, name in dirs.items():
            (self.home / name).mkdir(parents=True, exist_ok=True)
            env[var] = str(self.home / name)
        env[MARKER_VAR] = self.marker
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self) -> None:
        cmd = [
            self.python,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            f"--ServerApp.token={self.token}",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={self.notebook_dir}",
            "--ServerApp.open_browser=False",
            # window.jupyterapp: run JupyterLab's own commands (as its Galata tests do)
            "--LabApp.expose_app_in_browser=True",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        env = self.env()  # also makes the folders under home
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.notebook_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=5)
                return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab did not answer in {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}?token={self.token}"

    def api(self, method: str, path: str, *, timeout: float = 30):
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        if method in ("POST", "PATCH", "PUT"):
            request.data = b"{}"
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def note_processes(self) -> dict[int, str]:
        """Record the server's current descendants (kernels, ranks) and return them."""
        if self.proc is not None:
            now = descendants(self.proc.pid)
            self.seen.update({pid: (_start_time(pid), cmd) for pid, cmd in now.items()})
            return now
        return {}

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        return ""

    def shutdown(self, *, grace_s: float = 30.0) -> dict[int, str]:
        """Stop the server the way a user does (kernels first, via its API) and wait.

        Returns what was still running, from what the server had started,
        ``grace_s`` after that: it should be nothing. The caller then calls
        :meth:`kill` to end anything left, whatever this returned.
        """
        if self.proc is None:
            return {}
        self.note_processes()
        if self.proc.poll() is None:
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                self.api("POST", "/api/shutdown", timeout=grace_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        deadline = time.monotonic() + grace_s
        left = self.leftovers()
        while left and time.monotonic() < deadline:
            time.sleep(0.25)
            left = self.leftovers()
        return left

    def leftovers(self) -> dict[int, str]:
        """Processes started by this server (directly or not) that still run."""
        left = marked_processes(self.marker)
        if self.proc is not None and self.proc.poll() is None:
            left[self.proc.pid] = cmdline(self.proc.pid)
            left.update(descendants(self.proc.pid))
        for pid, (started, cmd) in self.seen.items():
            if _alive(pid) and _start_time(pid) == started:
                left.setdefault(pid, cmd)
        return left

    def kill(self) -> None:
        """End everything the server started, then the server's process group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        kill_all(list(self.leftovers()))
        self.log.close()


# -- what the page is asked, as JavaScript run in it (window.jupyterapp: --LabApp.expose_app_in_browser)
CURRENT = "window.jupyterapp.shell.currentWidget"
KERNEL_STATUS = f"""() => {{
  const w = window.jupyterapp && {CURRENT};
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : null;
}}"""
CODE_CELLS = f"""() => {CURRENT}.content.widgets.filter(c => c.model.type === 'code').map(c => {{
  const outputs = c.model.outputs.toJSON();
  return {{
    count: c.model.executionCount,
    errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
    text: outputs.map(o => o.text || (o.data && o.data['text/plain']) || '').join(''),
  }};
}})"""
ERROR_OUTPUTS = f"""() => {{
  const bad = [];
  for (const el of {CURRENT}.node.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .jp-RenderedText, .jupyter-widgets')) {{
    const text = el.textContent;
    if (text.includes('Traceback') || /^\\w*(Error|Exception)\\b:/m.test(text) || text.includes('Error displaying widget'))
      bad.push(text.slice(0, 500));
  }}
  return bad;
}}"""


def write_settings(home: Path) -> None:
    """No news toast; every cell rendered (no windowing), so that figures out of view are measured too."""
    settings = home / "settings" / "@jupyterlab"
    for name, value in (
        ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
        ("notebook-extension/tracker", {"windowingMode": "none"}),
    ):
        path = settings / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
