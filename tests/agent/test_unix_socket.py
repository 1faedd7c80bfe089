"""agent.unix_socket: whoever may write the socket's directory (a hostPath shared on the node)
can swap names in it while the agent binds; no swap makes the agent chmod another file."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.unix_socket import bind_private, remove_if_ours

Attack = Callable[[Path, str, Path], None]


def to_a_file(directory: Path, name: str, victim: Path) -> None:
    (directory / name).rename(directory / (name + ".moved"))
    (directory / name).symlink_to(victim)


def to_a_directory(directory: Path, name: str, victim: Path) -> None:
    """A symlink to a directory holding, under every name the agent might use, the victim."""
    decoy = directory.parent / "decoy"
    decoy.mkdir(exist_ok=True)
    for inner in ("s", "sock", name, "pluginevent.sock"):
        if not (decoy / inner).exists():
            (decoy / inner).symlink_to(victim)
    (directory / name).rename(directory / (name + ".moved"))
    (directory / name).symlink_to(decoy)


class Attacked(socket.socket):
    """A socket whose bind is followed at once by the attacker's move: every name in the
    socket's directory but the socket's own is swapped for a symlink."""

    def __init__(self, directory: Path, final: str, victim: Path, attack: Attack) -> None:
        super().__init__(socket.AF_UNIX, socket.SOCK_STREAM)
        self.directory, self.final, self.victim, self.attack = directory, final, victim, attack
        self.swapped: list[str] = []

    def bind(self, address: object) -> None:  # type: ignore[override]
        super().bind(address)  # type: ignore[arg-type]
        for name in sorted(os.listdir(self.directory)):
            if name != self.final and not name.endswith(".moved"):
                self.attack(self.directory, name, self.victim)
                self.swapped.append(name)


@pytest.fixture
def short_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory whose paths fit a Unix socket's 107 bytes."""
    path = Path("/tmp") / f"usock-{os.getpid()}-{tmp_path.name[-12:]}"
    path.mkdir()
    yield path
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            full = os.path.join(root, name)
            (os.unlink if os.path.islink(full) or not os.path.isdir(full) else os.rmdir)(full)
    path.rmdir()


@pytest.mark.parametrize("attack", [to_a_file, to_a_directory], ids=["file", "directory"])
def test_a_symlink_swapped_in_cannot_redirect_the_chmod(short_dir: Path, attack: Attack) -> None:
    run = short_dir / "run"
    run.mkdir(mode=0o777)
    os.chmod(run, 0o777)  # a hostPath anyone on the node may write
    victim = short_dir / "victim"
    victim.write_text("node file")
    os.chmod(victim, 0o644)
    path = run / "pluginevent.sock"
    with Attacked(run, path.name, victim, attack) as sock:
        inode = bind_private(sock, str(path), what="pod server socket", backlog=1)
        assert sock.swapped, "the attacker had a name to swap"
        assert stat.S_IMODE(victim.stat().st_mode) == 0o644, "the victim's mode is untouched"
        mode = os.lstat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        assert os.lstat(path).st_ino == inode
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
    remove_if_ours(str(path), inode)
    assert not path.exists()


def test_nothing_is_left_beside_the_socket(short_dir: Path) -> None:
    path = short_dir / "run" / "ztunnel.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        bind_private(sock, str(path), what="ZDS socket", backlog=1)
    assert os.listdir(path.parent) == ["ztunnel.sock"]
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_the_path_names_the_socket_only_once_it_listens(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's connect between a bind and its listen is refused: the rename that makes the
    path name the socket comes after the listen (a plugin's ADD at that instant failed)."""
    path = short_dir / "run" / "pluginevent.sock"
    listening_at_rename: list[int] = []
    real_replace = os.replace

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:

        def replace(*args: object, **kwargs: object) -> None:
            listening_at_rename.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
            real_replace(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr("agent.unix_socket.os.replace", replace)
        bind_private(sock, str(path), what="pod server socket", backlog=1)
    assert listening_at_rename == [1]
