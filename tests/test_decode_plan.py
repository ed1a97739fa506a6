"""The decode plan (csrc/kernels/decode.h: tile, key block, CTAs per SM counted, splits) of the
issue-5 grid cells whose choice a benchmark measured, through scripts/decode_plan.cpp (host code,
no GPU). A change of decode.h's rules that moves one of these cells has to be measured again
(bench/NOTES.md has the runs) and this list updated with it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# cell -> plan on the H200 (132 SMs), with the run that measured the choice.
PINNED = {
    # Run 66-67: the 16-row tile keeps 64-key blocks where 128-key ones cannot fill two CTAs per
    # SM (short caches of few heads), and takes them where they can.
    "d128 contiguous q1 h32/8 b1 kv1024": "keysplit16 kb64 ctas/sm 1 tiles 8 splits 8 ctas 64",
    "d128 contiguous q1 h32/32 b1 kv1024": "keysplit16 kb64 ctas/sm 1 tiles 32 splits 4 ctas 128",
    "d128 contiguous q1 h32/8 b1 kv32768":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 8 splits 32 ctas 256",
    "d128 contiguous q1 h32/8 b32 kv8192":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    # Run 69-70: the 32-row tile takes 128-key blocks only where its tiles fill the SMs.
    "d128 contiguous q8 h32/8 b32 kv8192":
        "keysplit32-kv128 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 contiguous q1 h32/1 b128 kv8192": "keysplit32 kb64 ctas/sm 1 tiles 128 splits 1 ctas 128",
    # Run 69-70: the 64-row tile's second CTA per SM, down to 8 key blocks per split; the
    # one-CTA count where the floor leaves SMs idle and that count fills them; the plain two-CTA
    # count where neither fills them.
    "d128 contiguous q4 h32/1 b8 kv32768": "decode64 kb64 ctas/sm 2 tiles 16 splits 16 ctas 256",
    "d128 contiguous q4 h32/1 b1 kv32768": "decode64 kb64 ctas/sm 2 tiles 2 splits 64 ctas 128",
    "d128 contiguous q8 h32/1 b8 kv1024": "decode64 kb64 ctas/sm 2 tiles 32 splits 4 ctas 128",
    "d128 contiguous q4 h32/1 b32 kv1024": "decode64 kb64 ctas/sm 2 tiles 64 splits 4 ctas 256",
    # Session 19 (call 3): d96 on the key-split tile, counted at one CTA per SM as d128's 64-key
    # one. Runs 69-70 had these cells on the 64-row tile at two (b8 kv32k 4 splits, 256 CTAs;
    # b1 kv8k 16 splits, 128 CTAs); call 3: b8 kv32k 3.58 -> 3.70 TB/s, b1 kv8k 1.25 -> 1.30.
    "d96 contiguous q1 h32/8 b8 kv32768": "keysplit16 kb64 ctas/sm 1 tiles 64 splits 2 ctas 128",
    "d96 contiguous q1 h32/8 b1 kv8192": "keysplit16 kb64 ctas/sm 1 tiles 8 splits 16 ctas 128",
    # Run 46 / 57: paged calls count two CTAs per SM; runs 73-74: with the 8-block floor on the
    # 64-row and 32-row tiles, without it on the 16-row tile.
    "d128 paged q1 h32/1 b32 kv1024": "keysplit32 kb64 ctas/sm 2 tiles 32 splits 4 ctas 128",
    "d128 paged q4 h32/1 b1 kv32768": "decode64 kb64 ctas/sm 2 tiles 2 splits 64 ctas 128",
    "d128 paged q8 h32/1 b8 kv1024": "decode64 kb64 ctas/sm 2 tiles 32 splits 4 ctas 128",
    "d128 paged q1 h32/8 b1 kv8192": "keysplit16 kb64 ctas/sm 2 tiles 8 splits 32 ctas 256",
    "d128 paged q1 h32/32 b1 kv1024": "keysplit16 kb64 ctas/sm 2 tiles 32 splits 8 ctas 256",
    # Session 26: the overlapped copies' twin (PINNED_SM90) is chosen on sm_90 GPUs only.
    "d128 paged q1 h32/8 b128 kv1024":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 1024 splits 1 ctas 1024",
    # Session 23 (runs 125-127): head groups (decode.h plan_packing) where the grouped step is
    # unsplit on a full wave (GQA b128 kv1k 1.029-1.035x, MHA b32 kv1k at G = 4 1.029-1.030x,
    # MHA b128 kv1k 1.017-1.018x of the plain tiles) or split on the 128-key tile with >= 96
    # blocks per split (MHA b8 kv131k 1.017-1.022x); not where grouping would split a short
    # step (GQA b8 / b32 kv1k, MHA b8 kv1k: 0.89-0.94x at every G) or runs the 64-key tile's
    # splits (GQA b1 kv131k at G = 4: 0.972x).
    "d128 contiguous q1 h32/8 b128 kv1024":
        "keysplit16-kv128-hg4 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 contiguous q1 h32/32 b32 kv1024":
        "keysplit16-kv128-hg4 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 contiguous q1 h32/32 b128 kv1024":
        "keysplit16-kv128-hg16 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 contiguous q1 h32/32 b8 kv131072":
        "keysplit16-kv128-hg16 kb128 ctas/sm 2 tiles 16 splits 33 ctas 528",
    "d128 contiguous q1 h32/8 b8 kv1024": "keysplit16 kb64 ctas/sm 1 tiles 64 splits 1 ctas 64",
    "d128 contiguous q1 h32/32 b8 kv1024":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 contiguous q1 h32/8 b1 kv131072":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 8 splits 32 ctas 256",
}


# The same on an sm_90 GPU (scripts/decode_plan.cpp ... sm90), where the ring tiles may run
# (decode.h plan_decode_tile). Session 21 (runs 116-118): paged 32-row steps of at most one CTA
# per SM in the plain plan, with at least 8 key blocks per CTA, take the ring; the rest keep the
# plain plans above (b1 kv32k and b32 kv1k: 4 blocks per CTA, 0.94-1.00x on the ring).
# Session 22 (runs 122-123): paged steps whose tiles the ring runs unsplit in one wave take it
# too (GQA b8 kv1k at 1, 4 and 8 query tokens, page 16 1.02-1.10x, page 256 1.08-1.16x; MQA
# b128 kv8k 1.03 / 1.04x).
PINNED_SM90 = {
    "d128 paged q1 h32/8 b8 kv1024": "ring16 kb64 ctas/sm 1 tiles 64 splits 1 ctas 64",
    "d128 paged q4 h32/8 b8 kv1024": "ring16 kb64 ctas/sm 1 tiles 64 splits 1 ctas 64",
    "d128 paged q8 h32/8 b8 kv1024": "ring32 kb64 ctas/sm 1 tiles 64 splits 1 ctas 64",
    "d128 paged q1 h32/1 b128 kv8192": "ring32 kb64 ctas/sm 1 tiles 128 splits 1 ctas 128",
    "d128 paged q1 h32/8 b1 kv8192": "keysplit16 kb64 ctas/sm 2 tiles 8 splits 32 ctas 256",
    "d128 paged q1 h32/32 b1 kv1024": "keysplit16 kb64 ctas/sm 2 tiles 32 splits 8 ctas 256",
    "d128 paged q1 h32/1 b1 kv131072": "ring32 kb64 ctas/sm 1 tiles 1 splits 128 ctas 128",
    "d128 paged q1 h32/1 b128 kv1024": "ring32 kb64 ctas/sm 1 tiles 128 splits 1 ctas 128",
    "d128 paged q1 h32/1 b8 kv8192": "ring32 kb64 ctas/sm 1 tiles 8 splits 16 ctas 128",
    "d128 paged q1 h32/1 b1 kv32768": "keysplit32 kb64 ctas/sm 2 tiles 1 splits 128 ctas 128",
    "d128 paged q1 h32/1 b32 kv1024": "keysplit32 kb64 ctas/sm 2 tiles 32 splits 4 ctas 128",
    "d128 paged q1 h32/1 b32 kv8192": "keysplit32 kb64 ctas/sm 2 tiles 32 splits 8 ctas 256",
    "d128 contiguous q1 h32/1 b1 kv131072":
        "keysplit32 kb64 ctas/sm 1 tiles 1 splits 128 ctas 128",
    "d128 contiguous q1 h32/8 b32 kv8192":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    # Session 26 (runs 139-143): paged 16-row 128-key steps take the twin that issues each
    # block's V copy with its K copy where the CTAs are long or come in several waves, at
    # pages of <= 32 keys (page 16: GQA b32 kv131k 1.014-1.019x, b128 kv1k 1.018-1.026x), and
    # at larger pages only the short CTAs in several waves (page 64: GQA b128 kv1k 1.016-1.020x;
    # MHA b8 kv32k, long, 0.995-0.997x); single-wave steps of 8-32 blocks per CTA keep the
    # plain order (page 16: GQA b32 kv1k 0.983-0.990x, b1 kv32k 0.981-0.991x with it).
    "d128 paged q1 h32/8 b32 kv131072":
        "keysplit16-kv128-overlap kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 paged q1 h32/8 b128 kv1024":
        "keysplit16-kv128-overlap kb128 ctas/sm 2 tiles 1024 splits 1 ctas 1024",
    "d128 paged q1 h32/8 b32 kv1024":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
    "d128 paged q1 h32/8 b1 kv32768":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 8 splits 32 ctas 256",
    "d128 paged64 q1 h32/8 b128 kv1024":
        "keysplit16-kv128-overlap kb128 ctas/sm 2 tiles 1024 splits 1 ctas 1024",
    "d128 paged64 q1 h32/32 b8 kv32768":
        "keysplit16-kv128 kb128 ctas/sm 2 tiles 256 splits 1 ctas 256",
}


def run_plan(binary, *args):
    # The library's A/B switches off: the default rules.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASH_CUDA_DECODE_")}
    out = subprocess.run([str(binary), "132", *args], check=True, env=env,
                         stdout=subprocess.PIPE, text=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines())


@pytest.fixture(scope="module")
def plan_binary(tmp_path_factory):
    binary = tmp_path_factory.mktemp("decode_plan") / "decode_plan"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{ROOT / 'csrc'}",
                    str(ROOT / "scripts" / "decode_plan.cpp"), "-o", str(binary)], check=True)
    return binary


@pytest.fixture(scope="module")
def plans(plan_binary):
    return run_plan(plan_binary)


@pytest.mark.parametrize("cell", sorted(PINNED))
def test_decode_plan_pinned(plans, cell):
    assert plans[cell] == PINNED[cell]


@pytest.fixture(scope="module")
def plans_sm90(plan_binary):
    return run_plan(plan_binary, "sm90")


@pytest.mark.parametrize("cell", sorted(PINNED_SM90))
def test_decode_plan_pinned_sm90(plans_sm90, cell):
    assert plans_sm90[cell] == PINNED_SM90[cell]


def test_decode_plan_covers_the_grid(plans):
    """Every grid cell has a plan with 1..128 splits (combine.cu's limit) and tiles x splits
    CTAs."""
    assert len(plans) > 1000
    for cell, plan in plans.items():
        fields = plan.split()
        splits = int(fields[fields.index("splits") + 1])
        tiles = int(fields[fields.index("tiles") + 1])
        ctas = int(fields[fields.index("ctas") + 1])
        assert 1 <= splits <= 128, cell
        assert ctas == tiles * splits, cell
