"""A network namespace joined to this one by veth pairs, for partition tests (root only).

Each pair is a link between the test's namespace and the new one, on addresses the test
made: a process run inside (``ip netns exec``) reaches the host side's address through its
pair and nothing else, so taking one pair down cuts exactly that path, in both directions,
without a reset (packets vanish, as in a real partition). Everything made is removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

__all__ = ["Link", "Namespace", "namespace"]


@dataclass(frozen=True)
class Link:
    """One veth pair: ``host`` is this namespace's address on it, ``inside`` the other's."""

    host_device: str
    inside_device: str
    host: str
    inside: str


@dataclass(frozen=True)
class Namespace:
    """The namespace and its links, in the order asked for."""

    name: str
    links: tuple[Link, ...]

    @property
    def prefix(self) -> list[str]:
        """What runs a command inside it."""
        return ["ip", "netns", "exec", self.name]

    def cut(self, link: Link) -> None:
        """Take the link down inside the namespace: nothing crosses it either way."""
        _ip("netns", "exec", self.name, "ip", "link", "set", link.inside_device, "down")

    def heal(self, link: Link) -> None:
        """Bring the link up again."""
        _ip("netns", "exec", self.name, "ip", "link", "set", link.inside_device, "up")

    def impair(self, link: Link, qdisc: list[str]) -> None:
        """Queue the link's packets through ``qdisc`` (``tc``'s words, e.g. netem's delay and
        loss) at both of its ends, so both directions are impaired; skips the test, saying
        why, where the kernel has no such queueing discipline. Each qdisc goes with its
        device when the link is removed."""
        if shutil.which("tc") is None:
            pytest.skip("no tc command (iproute2) to impair a link")
        for prefix, device in ((self.prefix, link.inside_device), ([], link.host_device)):
            done = subprocess.run([*prefix, "tc", "qdisc", "add", "dev", device, "root",
                                   *qdisc], capture_output=True, timeout=10, check=False)
            if done.returncode != 0:
                pytest.skip(f"the kernel cannot impair a link with {qdisc[0]}: "
                            f"{done.stderr.decode().strip()}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def namespace(links: int) -> Iterator[Namespace]:
    """A fresh namespace with ``links`` veth pairs to this one (each a /30 of 10.213.0.0/16
    picked by this process's id); skips the test, saying why, where the kernel or the user
    cannot make them."""
    if shutil.which("ip") is None:
        pytest.skip("no ip command (iproute2) to make a network namespace")
    tag = os.getpid() % 60000
    name = f"dgtest{tag}"
    made: list[Link] = []
    try:
        try:
            _ip("netns", "add", name)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot make a network namespace: {exc.stderr.decode().strip()}")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        for number in range(links):
            base = 4 * ((tag * 4 + number) % 16384)  # the /30s of 10.213.0.0/16
            third, fourth = base // 256, base % 256
            link = Link(f"dgh{tag}x{number}", f"dgi{tag}x{number}",
                        f"10.213.{third}.{fourth + 1}", f"10.213.{third}.{fourth + 2}")
            _ip("link", "add", link.host_device, "type", "veth", "peer", "name",
                link.inside_device)
            made.append(link)
            _ip("link", "set", link.inside_device, "netns", name)
            _ip("addr", "add", f"{link.host}/30", "dev", link.host_device)
            _ip("link", "set", link.host_device, "up")
            _ip("netns", "exec", name, "ip", "addr", "add", f"{link.inside}/30", "dev",
                link.inside_device)
            _ip("netns", "exec", name, "ip", "link", "set", link.inside_device, "up")
        yield Namespace(name, tuple(made))
    finally:
        for link in made:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", link.host_device)  # takes its peer with it
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", name)
