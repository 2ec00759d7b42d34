"""Tests for policies.cluster: spec parsing, validation and placements."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from policies.cluster import MAX_GPUS_PER_NODE, MAX_NODES, ClusterSpec, ClusterSpecError, NodeSpec, Placement


# ---------------------------------------------------------------------- "NxG"
@pytest.mark.parametrize(
    "spec, nodes, gpus",
    [("4x8", 4, 8), ("128x8", 128, 8), ("1x1", 1, 1), (" 2 X 4 ", 2, 4)],
)
def test_parse_homogeneous(spec: str, nodes: int, gpus: int) -> None:
    c = ClusterSpec.parse(spec)
    assert c.num_nodes == nodes
    assert c.gpus_per_node == (gpus,) * nodes
    assert c.total_gpus == nodes * gpus
    assert c.is_homogeneous
    assert c.describe() == f"{nodes}x{gpus}"
    assert [n.name for n in c.nodes] == [f"node{i + 1}" for i in range(nodes)]
    # Seed testbed defaults: PCIe 16 GB/s inside, 40 Gbps IB = 5 GB/s outside.
    assert c.bw_ratio == pytest.approx(5.0 / 16.0)


def test_parse_passes_spec_through() -> None:
    c = ClusterSpec.parse("2x4")
    assert ClusterSpec.parse(c) is c


@pytest.mark.parametrize("spec", ["4y8", "4x", "x8", "4x8x2", "", "four by eight"])
def test_parse_bad_string(spec: str) -> None:
    with pytest.raises(ClusterSpecError, match="NODESxGPUS"):
        ClusterSpec.parse(spec)


@pytest.mark.parametrize("spec", ["0x8", "4x0", "0x0"])
def test_parse_zero(spec: str) -> None:
    with pytest.raises(ClusterSpecError, match=r"must be >= 1"):
        ClusterSpec.parse(spec)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ClusterSpecError, match="nope.yaml.*NODESxGPUS"):
        ClusterSpec.parse(str(missing))
    with pytest.raises(ClusterSpecError, match="NODESxGPUS"):
        ClusterSpec.parse(tmp_path)  # a directory is not a cluster file


# ---------------------------------------------------------------------- files
def test_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "intra_bw_gbps: 32\n"
        "inter_bw_gbps: 12.5\n"
        "nodes:\n"
        "  - {name: big, gpus: 8}\n"
        "  - {name: small, gpus: 4, count: 2}\n"
        "  - {gpus: 2}\n"
    )
    c = ClusterSpec.parse(f)
    assert [n.name for n in c.nodes] == ["big", "small1", "small2", "node4"]
    assert c.gpus_per_node == (8, 4, 4, 2)
    assert c.total_gpus == 18
    assert not c.is_homogeneous
    assert c.max_gpus_per_node == 8
    assert c.intra_bw_gbps == 32.0 and c.inter_bw_gbps == 12.5
    assert c.node_index("small2") == 2
    assert c.describe() == "4 nodes / 18 GPUs"
    # to_dict round-trips through the YAML reader.
    import yaml

    g = tmp_path / "round.yml"
    g.write_text(yaml.safe_dump(c.to_dict()))
    assert ClusterSpec.parse(g) == c


def test_toml_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        "inter_bw_gbps = 25\n"
        "[[nodes]]\nname = \"gpu\"\ngpus = 8\ncount = 3\n"
        "[[nodes]]\nname = \"odd\"\ngpus = 4\n"
    )
    c = ClusterSpec.parse(str(f))
    assert [n.name for n in c.nodes] == ["gpu1", "gpu2", "gpu3", "odd"]
    assert c.gpus_per_node == (8, 8, 8, 4)
    assert c.inter_bw_gbps == 25.0 and c.intra_bw_gbps == 16.0


@pytest.mark.parametrize(
    "suffix, text, match",
    [
        (".yaml", "nodes: [ {gpus: 8}\n", "cannot parse cluster file"),
        (".toml", "[[nodes]\ngpus = 8\n", "cannot parse cluster file"),
        (".yaml", "- 1\n- 2\n", "expected a mapping with a 'nodes' list"),
        (".yaml", "nodes:\n  - {name: a}\n", r"nodes\[0\]: each node needs 'gpus'"),
        (".yaml", "nodes:\n  - {gpus: 0}\n", r"nodes\[0\]\.gpus: expected a positive integer"),
        (".yaml", "nodes:\n  - {gpus: 8}\n  - {gpus: 2.5}\n", r"nodes\[1\]\.gpus: expected a positive integer"),
        (".yaml", "nodes:\n  - {gpus: 8, count: 0}\n", r"nodes\[0\]\.count: expected a positive integer"),
        (".yaml", "nodes:\n  - {name: a, gpus: 8}\n  - {name: a, gpus: 4}\n", "duplicate node names"),
        (".yaml", "nodes: []\n", "at least one node"),
        (".yaml", "nodes: {gpus: 8}\n", "'nodes' must be a list"),
        (".yaml", "nodes:\n  - {gpus: true}\n", r"nodes\[0\]\.gpus: expected a positive integer"),
        (".yaml", "inter_bw_gbps: fast\nnodes:\n  - {gpus: 8}\n", "inter_bw_gbps: expected a number"),
        (".yaml", "inter_bw_gbps: 0\nnodes:\n  - {gpus: 8}\n", "bandwidths must be positive"),
        # Non-finite bandwidths would give NaN throughputs (and a crash) in the simulator.
        (".toml", "intra_bw_gbps = nan\n[[nodes]]\ngpus = 4\n", "positive and finite: intra_bw_gbps = nan"),
        (".toml", "inter_bw_gbps = inf\n[[nodes]]\ngpus = 4\n", "inter_bw_gbps = inf"),
        (".toml", "inter_bw_gbps = -inf\n[[nodes]]\ngpus = 4\n", "inter_bw_gbps = -inf"),
        (".yaml", "intra_bw_gbps: .nan\nnodes:\n  - {gpus: 8}\n", "intra_bw_gbps = nan"),
        (".yaml", "inter_bw_gbps: .inf\nnodes:\n  - {gpus: 8}\n", "inter_bw_gbps = inf"),
        (".yaml", "inter_bw_gbps: nan\nnodes:\n  - {gpus: 8}\n", "inter_bw_gbps = nan"),  # the string "nan"
        (".yaml", "inter_bw_gbps: 1e999\nnodes:\n  - {gpus: 8}\n", "inter_bw_gbps = inf"),
        pytest.param(
            ".yaml", "inter_bw_gbps: 1%s\nnodes:\n  - {gpus: 8}\n" % ("0" * 400), "inter_bw_gbps: expected a number",
            id="yaml-huge-int",
        ),
        (".yaml", "inter_bw_gbps: true\nnodes:\n  - {gpus: 8}\n", "inter_bw_gbps: expected a number, got True"),
    ],
)
def test_bad_files(tmp_path: Path, suffix: str, text: str, match: str) -> None:
    f = tmp_path / f"bad{suffix}"
    f.write_text(text)
    with pytest.raises(ClusterSpecError, match=match) as err:
        ClusterSpec.parse(f)
    # Every file error names the file.
    assert str(f) in str(err.value)


@pytest.mark.parametrize("field", ["intra_bw_gbps", "inter_bw_gbps"])
@pytest.mark.parametrize("bw", [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, "5", None, True])
def test_bad_bandwidth_direct(field: str, bw: object) -> None:
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec((NodeSpec("n", 8),), **{field: bw})
    assert f"bandwidths must be positive and finite: {field} = {bw!r}" in str(err.value)


def test_duplicate_names_direct() -> None:
    with pytest.raises(ClusterSpecError, match="duplicate node names"):
        ClusterSpec((NodeSpec("a", 8), NodeSpec("a", 8)))


def test_bad_node_gpus_direct() -> None:
    with pytest.raises(ClusterSpecError, match="'x': gpus must be a positive integer"):
        ClusterSpec((NodeSpec("x", 0),))


def test_cluster_spec_error_is_value_error() -> None:
    assert issubclass(ClusterSpecError, ValueError)


# ---------------------------------------------------------------------- placement
def test_placement_of_merges_and_sorts() -> None:
    p = Placement.of([(2, 3), (0, 4), (2, 1), (1, 0)])
    assert p.alloc == ((0, 4), (2, 4))
    assert p.total_gpus == 8
    assert p.shape == (8, 2)
    assert p.nodes == (0, 2)
    assert p.num_nodes == 2
    assert p.max_per_node == 4
    assert p.as_dict() == {0: 4, 2: 4}
    assert str(p) == "{0:4, 2:4}"
    assert p == Placement.of({2: 4, 0: 4})
    assert hash(p) == hash(Placement.of({0: 4, 2: 4}))


def test_placement_fits() -> None:
    p = Placement.of({0: 4, 2: 4})
    assert p.fits([4, 0, 8])
    assert not p.fits([3, 8, 8])
    assert not p.fits([8, 8])  # node 2 does not exist


def test_placement_negative() -> None:
    with pytest.raises(ValueError, match="negative GPU count"):
        Placement.of({0: -1})


def test_empty_placement() -> None:
    p = Placement.of({})
    assert p.total_gpus == 0 and p.num_nodes == 0 and p.max_per_node == 0


TOP = "nodes, intra_bw_gbps, inter_bw_gbps, ps_placement"
NODE = "name, gpus, count, gpu_type, gpu_speed, cpus, mem_gb, switch"


@pytest.mark.parametrize(
    "suffix, text, where, key, accepted",
    [
        # a misspelt key is an error, not ignored: gpu_per_node here, gpu in a node
        (".yaml", "gpu_per_node: 8\nnodes:\n  - {gpus: 8}\n", "", "gpu_per_node", TOP),
        (".yaml", "inter_bw: 12\nnodes:\n  - {gpus: 8}\n", "", "inter_bw", TOP),
        (".yaml", "node:\n  - {gpus: 8}\n", "", "node", TOP),
        (".yaml", "nodes:\n  - {gpus: 8}\n  - {gpus: 4, cnt: 2}\n", "nodes[1]: ", "cnt", NODE),
        (".yaml", "nodes:\n  - {gpu: 8}\n", "nodes[0]: ", "gpu", NODE),
        (".toml", "intra_bw = 16\n[[nodes]]\ngpus = 4\n", "", "intra_bw", TOP),
        (".toml", "[[nodes]]\ngpus = 4\ncount = 2\nprefix = \"gpu\"\n", "nodes[0]: ", "prefix", NODE),
    ],
)
def test_unknown_keys_are_refused(tmp_path: Path, suffix: str, text: str, where: str, key: str, accepted: str) -> None:
    f = tmp_path / f"c{suffix}"
    f.write_text(text)
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(f)
    assert str(err.value) == f"{f}: {where}unknown key {key!r} (accepted: {accepted})"


def test_unknown_key_is_a_one_line_cli_error(tmp_path: Path, capsys) -> None:
    from rlsched.cli import main

    f = tmp_path / "c.yaml"
    f.write_text("gpu_per_node: 8\nnodes:\n  - {gpus: 8, count: 4}\n")
    out = tmp_path / "o"
    assert main(["simulate", "--cluster", str(f), "--policy", "fifo", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{f}: unknown key 'gpu_per_node'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_unnamed_counted_nodes_are_numbered_on_and_bool_count_is_refused(tmp_path):
    """Unnamed entries continue node1, node2, ... across entries (not node11, node12); a prefix
    with count gives PREFIX1..PREFIXn; ``count: true`` is not the number 1."""
    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n  - {gpus: 8, count: 2}\n  - {gpus: 4, count: 2}\n  - {name: gpu, gpus: 2, count: 2}\n")
    spec = ClusterSpec.parse(f)
    assert [n.name for n in spec.nodes] == ["node1", "node2", "node3", "node4", "gpu1", "gpu2"]
    assert spec.gpus_per_node == (8, 8, 4, 4, 2, 2)
    f.write_text("nodes:\n  - {gpus: 8, count: true}\n")
    with pytest.raises(ClusterSpecError, match=r"nodes\[0\]\.count: expected a positive integer, got True"):
        ClusterSpec.parse(f)


# ---------------------------------------------------------------------- size limits
def test_largest_cluster_is_accepted() -> None:
    c = ClusterSpec.parse(f"{MAX_NODES}x{MAX_GPUS_PER_NODE}")
    assert (c.num_nodes, c.total_gpus) == (65_536, 65_536 * 64)


@pytest.mark.parametrize("spec", ["65537x8", "8x65", "100000000x8", "1000000x8", "1" * 5000 + "x8", "4x" + "9" * 30])
def test_too_large_cluster_spec_is_refused_at_once(spec: str) -> None:
    """100000000x8 took 3 GB and never started; 5000 digits was a ValueError traceback from int()."""
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(spec)
    msg = str(err.value)
    assert msg.endswith("at most 65,536 nodes of at most 64 GPUs") and len(msg) < 120, msg


@pytest.mark.parametrize(
    "text, words",
    [
        ("nodes:\n  - {gpus: 65}\n", "nodes[0].gpus: at most 64 GPUs per node, got 65"),
        ("nodes:\n  - {gpus: 8, count: 100000000}\n", "nodes[0].count: 100000000 would make 100000000 nodes"),
        ("nodes:\n  - {gpus: 8, count: 65000}\n  - {gpus: 8, count: 537}\n", "nodes[1].count: 537 would make 65537"),
    ],
)
def test_too_large_cluster_file_is_refused(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(f)
    assert str(err.value).startswith(f"{f}: {words}"), str(err.value)


def test_too_large_cluster_built_directly_is_refused() -> None:
    with pytest.raises(ClusterSpecError, match="node 'n': at most 64 GPUs per node, got 128"):
        ClusterSpec((NodeSpec("n", 128),))
    with pytest.raises(ClusterSpecError, match="at most 65,536 nodes, got 65,537"):
        ClusterSpec(tuple(NodeSpec(f"n{i}", 1) for i in range(MAX_NODES + 1)))


def test_too_large_cluster_is_a_one_line_cli_error(tmp_path: Path, capsys) -> None:
    from rlsched.cli import main

    out = tmp_path / "o"
    assert main(["simulate", "--cluster", "100000000x8", "--policy", "fifo", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == "rlsched simulate: error: cluster 100000000x8: at most 65,536 nodes of at most 64 GPUs\n"
    assert not out.exists()


# ---------------------------------------------------------------------- file syntax, keys, names
def test_yaml_syntax_error_is_one_line_naming_file_and_line(tmp_path: Path, capsys) -> None:
    """It was 6 lines naming "<unicode string>"."""
    from rlsched.cli import main

    f = tmp_path / "g.yaml"
    f.write_text("nodes:\n  - {gpus: 8\n")
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(f)
    assert str(err.value) == (
        f"{f}: cannot parse cluster file: line 3, column 1: expected ',' or '}}', but got '<stream end>' "
        "(while parsing a flow mapping at line 2)"
    )
    out = tmp_path / "o"
    assert main(["simulate", "--cluster", str(f), "--policy", "fifo", "--out", str(out), "--quiet"]) == 2
    err_text = capsys.readouterr().err
    assert err_text.count("\n") == 1 and "<unicode string>" not in err_text
    assert not out.exists()


@pytest.mark.parametrize("suffix, text", [(".yaml", "nodes: [\n"), (".yaml", "\tnodes: 1\n"), (".toml", "nodes = [\n")])
def test_other_syntax_errors_are_one_line(tmp_path: Path, suffix: str, text: str) -> None:
    f = tmp_path / f"g{suffix}"
    f.write_text(text)
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(f)
    assert str(err.value).startswith(f"{f}: cannot parse cluster file: ") and "\n" not in str(err.value)


def test_directory_is_named_as_one(tmp_path: Path) -> None:
    """It said "expected ... a YAML/TOML file that exists" of a directory that exists."""
    d = tmp_path / "somedir.yaml"
    d.mkdir()
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(str(d))
    assert str(err.value) == (
        f"bad cluster spec {str(d)!r}: is a directory; expected NODESxGPUS (e.g. 4x8) or a YAML/TOML file"
    )


@pytest.mark.parametrize(
    "text, line, key",
    [
        ("nodes:\n  - {gpus: 8}\nnodes:\n  - {gpus: 4}\n", 3, "nodes"),  # YAML itself would keep the last
        ("nodes:\n  - gpus: 8\n    gpus: 4\n", 3, "gpus"),
        ("intra_bw_gbps: 16\nintra_bw_gbps: 32\nnodes: [{gpus: 8}]\n", 2, "intra_bw_gbps"),
    ],
)
def test_yaml_duplicate_keys_are_refused(tmp_path: Path, text: str, line: int, key: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(f)
    assert str(err.value) == f"{f}: line {line}: key {key!r} appears twice in one mapping"


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n  - &b {gpus: 8, name: a}\n  - {<<: *b, name: y}\n  - {<<: *b, name: z, gpus: 4}\n")
    assert [(n.name, n.gpus) for n in ClusterSpec.parse(f).nodes] == [("a", 8), ("y", 8), ("z", 4)]


@pytest.mark.parametrize("name", ['""', "' '", "null"])
def test_empty_node_name_is_refused(tmp_path: Path, name: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"nodes:\n  - {{gpus: 8, name: {name}}}\n")
    with pytest.raises(ClusterSpecError, match=r"nodes\[0\]\.name: expected a non-empty name \(or no 'name' key\)"):
        ClusterSpec.parse(f)
    with pytest.raises(ClusterSpecError, match="node names must be non-empty strings, got ''"):
        ClusterSpec((NodeSpec("", 8),))


# ---------------------------------------------------------------------- GPU types, CPUs, memory, switches
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "spec, gpus, types, describe",
    [
        ("4x8:V100", (8,) * 4, ("V100",) * 4, "4x8:V100"),
        ("2x8:v100+2x8:k80", (8,) * 4, ("v100", "v100", "k80", "k80"), "2x8:v100+2x8:k80"),
        (" 1x8:p100 + 2 x 4 : k80 ", (8, 4, 4), ("p100", "k80", "k80"), "1x8:p100+2x4:k80"),
        ("1x8+1x4", (8, 4), (None, None), "2 nodes / 12 GPUs"),  # untyped groups: as any heterogeneous cluster
        ("1x8:titan-xp+1x8", (8, 8), ("titan-xp", None), "1x8:titan-xp+1x8"),
    ],
)
def test_parse_typed_and_grouped_specs(spec: str, gpus: tuple, types: tuple, describe: str) -> None:
    c = ClusterSpec.parse(spec)
    assert c.gpus_per_node == gpus and c.gpu_types == types
    assert [n.name for n in c.nodes] == [f"node{i + 1}" for i in range(len(gpus))]  # numbered on across groups
    assert c.describe() == describe
    assert c.is_typed == any(t is not None for t in types)
    if "/" not in describe:  # the description of a spec without CPUs/memory is a spec of the same cluster
        assert ClusterSpec.parse(describe) == c


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("4x8:a100", "cluster 4x8:a100: unknown GPU type 'a100' (known: k80, p100, titanxp, v100); give the node's "
                     "speed relative to a TITAN Xp with gpu_speed in a cluster file"),
        ("2x8:v100+0x8:k80", "cluster 2x8:v100+0x8:k80: 0x8: both numbers must be >= 1"),
        ("2x8:v100+1x65:k80", "at most 65,536 nodes of at most 64 GPUs"),
        ("65536x8+1x8", "cluster 65536x8+1x8: at most 65,536 nodes of at most 64 GPUs"),
        ("4x8+" + "9" * 12 + "x8", "at most 65,536 nodes of at most 64 GPUs"),
    ],
)
def test_bad_typed_specs(spec: str, msg: str) -> None:
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(spec)
    assert msg in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("spec", ["4x8:", "4x8:v 100", "4x8+", "+4x8", "4x8:v100:2", "4x8++2x8"])
def test_malformed_typed_specs(spec: str) -> None:
    with pytest.raises(ClusterSpecError, match="NODESxGPUS"):
        ClusterSpec.parse(spec)


def test_untyped_cluster_describes_and_serialises_as_before() -> None:
    """Tests, golden files and checkpoints read these texts: no new keys for clusters without attributes."""
    c = ClusterSpec.parse("2x4")
    assert c.describe() == c.describe_gpus() == "2x4" and not c.is_typed and not c.has_attributes
    assert c.to_dict() == {
        "nodes": [{"name": "node1", "gpus": 4}, {"name": "node2", "gpus": 4}],
        "intra_bw_gbps": 16.0,
        "inter_bw_gbps": 5.0,
    }
    assert ClusterSpec((NodeSpec("a", 8), NodeSpec("b", 4))).describe() == "2 nodes / 12 GPUs"


def test_node_attributes_in_files(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "nodes:\n"
        "  - {name: fast, gpus: 8, count: 2, gpu_type: V100, cpus: 64, mem_gb: 512, switch: rack1}\n"
        "  - {gpus: 4, gpu_type: a100, gpu_speed: 2.5, switch: 7}\n"
        "  - {gpus: 4, gpu_speed: 0.5}\n"
    )
    c = ClusterSpec.parse(f)
    assert [n.name for n in c.nodes] == ["fast1", "fast2", "node3", "node4"]
    assert c.gpu_types == ("V100", "V100", "a100", None)
    assert c.cpus_per_node == (64, 64, None, None) and c.mem_gb_per_node == (512.0, 512.0, None, None)
    assert c.switches == ("rack1", "rack1", "7", None)
    assert [n.gpu_speed for n in c.nodes] == [None, None, 2.5, 0.5]
    assert c.is_typed and c.has_attributes
    assert c.describe() == "2x8:V100(64 CPUs, 512 GB)+1x4:a100(speed 2.5)+1x4(speed 0.5), 2 switches"
    d = c.to_dict()["nodes"]
    assert d[0] == {"name": "fast1", "gpus": 8, "gpu_type": "V100", "cpus": 64, "mem_gb": 512.0, "switch": "rack1"}
    assert d[2] == {"name": "node3", "gpus": 4, "gpu_type": "a100", "gpu_speed": 2.5, "switch": "7"}
    assert d[3] == {"name": "node4", "gpus": 4, "gpu_speed": 0.5}
    t = tmp_path / "c.toml"
    t.write_text('[[nodes]]\ngpus = 8\ncount = 2\ngpu_type = "k80"\ncpus = 32\nmem_gb = 256.5\nswitch = "s1"\n')
    c2 = ClusterSpec.parse(t)
    assert c2.nodes[1] == NodeSpec("node2", 8, "k80", cpus=32, mem_gb=256.5, switch="s1")


@pytest.mark.parametrize(
    "entry, words",
    [
        ("{gpus: 8, gpu_type: a100}", "nodes[0].gpu_type: unknown GPU type 'a100' (known: k80, p100, titanxp, v100)"),
        ("{gpus: 8, gpu_type: 100}",
         "nodes[0].gpu_type: expected a GPU type name (letters, digits, '_', '.', '-'), got 100"),
        ("{gpus: 8, gpu_type: 'v 100'}", "nodes[0].gpu_type: expected a GPU type name"),
        ("{gpus: 8, gpu_speed: 0}", "nodes[0].gpu_speed: expected a positive finite number, got 0"),
        ("{gpus: 8, gpu_speed: .nan}", "nodes[0].gpu_speed: expected a positive finite number, got nan"),
        ("{gpus: 8, gpu_speed: fast}", "nodes[0].gpu_speed: expected a positive finite number, got 'fast'"),
        ("{gpus: 8, cpus: 0}", "nodes[0].cpus: expected a positive integer, got 0"),
        ("{gpus: 8, cpus: 2.5}", "nodes[0].cpus: expected a positive integer, got 2.5"),
        ("{gpus: 8, cpus: true}", "nodes[0].cpus: expected a positive integer, got True"),
        ("{gpus: 8, mem_gb: -1}", "nodes[0].mem_gb: expected a positive finite number, got -1"),
        ("{gpus: 8, mem_gb: .inf}", "nodes[0].mem_gb: expected a positive finite number, got inf"),
        ("{gpus: 8, switch: ''}", "nodes[0].switch: expected a non-empty name, got ''"),
        ("{gpus: 8, switch: [a]}", "nodes[0].switch: expected a non-empty name, got ['a']"),
    ],
)
def test_bad_node_attributes_in_files(tmp_path: Path, entry: str, words: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"nodes:\n  - {entry}\n")
    with pytest.raises(ClusterSpecError) as err:
        ClusterSpec.parse(f)
    assert str(err.value).startswith(f"{f}: {words}"), str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_gpu_type_is_a_one_line_cli_error(tmp_path: Path, capsys) -> None:
    from rlsched.cli import main

    out = tmp_path / "o"
    assert main(["simulate", "--cluster", "2x8:h100", "--policy", "fifo", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown GPU type 'h100'" in err and "gpu_speed" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"gpu_type": "v 100"}, "node 'n': gpu_type must be a name"),
        ({"gpu_type": 3}, "node 'n': gpu_type must be a name"),
        ({"cpus": 0}, "node 'n': cpus must be a positive integer, got 0"),
        ({"cpus": True}, "node 'n': cpus must be a positive integer, got True"),
        ({"mem_gb": 0.0}, "node 'n': mem_gb must be a positive finite number, got 0.0"),
        ({"mem_gb": math.nan}, "node 'n': mem_gb must be a positive finite number, got nan"),
        ({"gpu_speed": -1.0}, "node 'n': gpu_speed must be a positive finite number"),
        ({"switch": " "}, "node 'n': switch must be a non-empty name"),
    ],
)
def test_bad_node_attributes_direct(kw: dict, msg: str) -> None:
    with pytest.raises(ClusterSpecError, match=msg):
        NodeSpec("n", 8, **kw)


def test_typed_node_built_directly_needs_no_known_type() -> None:
    """Built in code (the Slurm adapter), a type name is a label; only specs and files check it against
    the speed table (with gpu_speed unset)."""
    c = ClusterSpec((NodeSpec("n", 8, "h100"),))
    assert c.gpu_types == ("h100",) and c.is_typed


def test_shipped_two_type_cluster_file() -> None:
    c = ClusterSpec.parse(REPO / "slurm_conf" / "cluster-two-types.yaml")
    assert c.gpus_per_node == (8,) * 4 and c.gpu_types == ("v100", "v100", "k80", "k80")
    assert [n.name for n in c.nodes] == ["fast1", "fast2", "slow1", "slow2"]
    assert c.switches == ("rack1", "rack1", "rack2", "rack2")
    assert c.describe_gpus() == "4x8"
