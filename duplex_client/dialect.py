"""Which contract a connection speaks, and the URL that asks for it.

``ga`` (the default) is the OpenAI Realtime contract with the project's extensions;
``duplex`` is the seed's (vLLM-Omni's ``?duplex=1``): the client dials with ``duplex=1`` and
``autostart=0`` (so that no session is opened for the URL before the client's own
``session.update``), and reads the seed's shapes where they differ (``attachment_generation``,
``session.capabilities``, the nested ``playback.acknowledged``, a flat ``error``). The readers
of :mod:`duplex_client.events` accept both shapes on either dialect.
"""

from __future__ import annotations

import enum
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["Dialect", "dialect_url"]


class Dialect(enum.StrEnum):
    GA = "ga"
    DUPLEX = "duplex"


def dialect_url(url: str, dialect: Dialect, model: str | None = None) -> str:
    """``url`` with the query the dialect needs: unchanged for ``ga``; for ``duplex``,
    ``duplex=1``, ``autostart=0`` (forced: the client always opens with its own
    ``session.update`` or resumes with ``session.resume``) and ``model`` when given and the
    URL names none."""
    if dialect is Dialect.GA:
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query["duplex"] = "1"
    if model is not None:
        query.setdefault("model", model)
    query["autostart"] = "0"
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query),
                       parts.fragment))
