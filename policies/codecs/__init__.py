"""Observation / action codecs of the learned policies, and their registry.

The protocol every codec implements is in :mod:`policies.codecs.base` (:class:`Codec`,
:class:`CodecRound`, :class:`Encoding`, :class:`CodecSpec`); codecs register here by name, and a
checkpoint records the name of its codec and the codec's spec (:mod:`policies.checkpoint`).

Registered codecs:

* ``deepshare-v1``: :class:`~policies.codecs.deepshare.DeepShareCodec`, the DeepShare-style
  two-half observation (:mod:`policies.codecs.deepshare`) of ``rl-base``, ``rl-hybrid`` and ``rl-prior``.
* ``sced2-v1``: :class:`~policies.codecs.sced2.Sced2Codec`, SCED2's GPU-state / job-state observation
  and job-selection actions (:mod:`policies.codecs.sced2`) of ``sced2``.
* ``sizefree-v1``: :class:`~policies.codecs.sizefree.SizeFreeCodec`, candidate (job, placement) rows
  and pooled node context, independent of the cluster's size (:mod:`policies.codecs.sizefree`) of ``rl-sf``.
"""

from __future__ import annotations

from typing import Any

from policies.cluster import ClusterSpec
from policies.codecs.base import Box, Codec, CodecError, CodecRound, CodecSpec, Discrete, Encoding
from policies.codecs.deepshare import DeepShareCodec, EncodingError, ObsSpec
from policies.codecs.sced2 import Sced2Codec, Sced2Spec
from policies.codecs.sizefree import SizeFreeCodec, SizeFreeSpec
from policies.perf import ContentionModel

__all__ = [
    "DEFAULT_CODEC",
    "Box",
    "Codec",
    "CodecError",
    "CodecRound",
    "CodecSpec",
    "DeepShareCodec",
    "Discrete",
    "Encoding",
    "EncodingError",
    "ObsSpec",
    "Sced2Codec",
    "Sced2Spec",
    "SizeFreeCodec",
    "SizeFreeSpec",
    "codec_class",
    "codec_names",
    "make_codec",
    "register_codec",
    "spec_from_dict",
]

#: The codec of checkpoints that name none (``policies/checkpoints/``' shipped ones) and of new training runs.
DEFAULT_CODEC = DeepShareCodec.name

_CODECS: dict[str, type] = {}


def register_codec(cls: type) -> type:
    """Register a codec class under its ``name`` (usable as a class decorator).

    The class implements :class:`Codec` and has ``spec_from_dict(dict) -> spec`` (a classmethod
    raising :class:`CodecError` on a malformed spec) and a constructor ``cls(cluster, perf, spec)``.
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"codec class {cls.__name__} has no name")
    if _CODECS.get(name, cls) is not cls:
        raise ValueError(f"codec name {name!r} is already registered by {_CODECS[name].__name__}")
    _CODECS[name] = cls
    return cls


def codec_names() -> tuple[str, ...]:
    """The registered codec names, sorted."""
    return tuple(sorted(_CODECS))


def codec_class(name: str) -> type:
    """The codec class registered as ``name``; :class:`CodecError` naming the known ones otherwise."""
    cls = _CODECS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(f"unknown codec {name!r}; known codecs: {', '.join(codec_names())}")
    return cls


def spec_from_dict(name: str, d: Any) -> CodecSpec:
    """Codec ``name``'s spec from its stored form (``spec.to_dict()``); :class:`CodecError` if malformed."""
    return codec_class(name).spec_from_dict(d)


def make_codec(name: str, cluster: ClusterSpec, perf: ContentionModel, spec: CodecSpec | None = None) -> Codec:
    """Codec ``name`` for ``cluster`` (``spec``: its spec, checked against the cluster; ``None``: the
    codec's default for the cluster)."""
    return codec_class(name)(cluster, perf, spec)


register_codec(DeepShareCodec)
register_codec(Sced2Codec)
register_codec(SizeFreeCodec)
