"""What the compiled programs say about a run on a topology: memory against HBM, FLOPs, collectives, speed.

The speed is a roofline prediction, not a measurement: each program takes the longer of its FLOPs at
the chip's published bf16 peak and its HBM traffic at the published bandwidth. It ignores the time
collectives take on the interconnect (XLA overlaps much of it with compute, not all), kernel launch
and host overheads, and input-pipeline stalls, so real steps are slower; the model FLOPs utilization
it implies is printed so the assumption is visible.
"""

from __future__ import annotations

import dataclasses

from jax.sharding import Mesh

from transformer_jax.aot.chips import CHIPS
from transformer_jax.aot.compile import Program, RunShapes
from transformer_jax.aot.measured import measured_line
from transformer_jax.aot.topology import Topology
from transformer_jax.model.flops import attention_score_flops, train_step_flops

# The paper's base run: 100k updates of about 25k target tokens (section 5.2).
PAPER_STEPS = 100_000
PAPER_TOKENS_PER_STEP = 25_000
BULK_SENTENCES = 100_000_000  # a back-translation corpus (Edunov et al. 2018 translated 226M sentences)
# What JAX's GPU client takes of device memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION).
GPU_PREALLOCATED = 0.75


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The numbers the table prints, and whether the run fits."""

    peak_bytes: int  # per device, the largest program (with the accumulated gradients, if any)
    hbm_bytes: int
    step_seconds: float  # roofline, one optimizer update
    compute_seconds: float  # the update's FLOPs at the chip's peak alone
    memory_seconds: float  # the update's HBM traffic (XLA's bytes accessed) at the chip's bandwidth alone
    tokens_per_second: float  # target token slots per second
    xla_flops: float  # all devices, one update
    analytic_flops: float  # model FLOPs of one update (transformer_jax.model.flops)
    assumed_mfu: float
    estimated_seconds: float | None = None  # one update by libtpu's cycle estimates (aot/cycles.py); None off TPUs

    @property
    def fits(self) -> bool:
        """True when the largest program fits the device's memory."""
        return self.peak_bytes <= self.hbm_bytes


def roofline_seconds(program: Program, topology: Topology) -> float:
    """max(FLOPs / peak, HBM bytes / bandwidth) for one device."""
    return max(*_bounds(program, topology))


def _bounds(program: Program, topology: Topology) -> tuple[float, float]:
    """(FLOPs at peak, bytes accessed at HBM bandwidth) in seconds, for one device."""
    return (program.flops / topology.peak_flops_per_device,
            program.bytes_accessed / topology.hbm_bandwidth_per_device)


def verdict(shapes: RunShapes, programs: list[Program], topology: Topology, accumulation: int,
            hbm_bytes: int | None = None) -> Verdict:
    """Fit and predicted speed of one optimizer update of the run."""
    devices = len(topology.devices)
    # The update of the largest training batch: its train step, or its micro-step (x accumulation) and the update.
    train = [p for p in programs if p.name in (f"train step {shapes.rows}x{shapes.width}",
                                               f"micro-step gradients {shapes.rows}x{shapes.width}")][0]
    counts = [(train, accumulation)]
    peak_train = train.total_bytes
    if train.name.startswith("micro-step gradients"):
        counts.append(([p for p in programs if p.name == "apply accumulated gradients"][0], 1))
        # Between micro-steps the running sum of gradients lives beside the state.
        peak_train += train.output_bytes
    seconds = sum(times * roofline_seconds(program, topology) for program, times in counts)
    compute = sum(times * _bounds(program, topology)[0] for program, times in counts)
    memory = sum(times * _bounds(program, topology)[1] for program, times in counts)
    xla_flops = devices * sum(times * program.flops for program, times in counts)
    peak = max([peak_train] + [p.total_bytes for p in programs if p is not train])
    analytic = accumulation * train_step_flops(shapes.model, shapes.rows, shapes.width, shapes.width)
    tokens = accumulation * shapes.rows * shapes.width
    return Verdict(peak, hbm_bytes or topology.hbm_bytes_per_device, seconds, compute, memory, tokens / seconds,
                   xla_flops, analytic, analytic / (seconds * devices * topology.peak_flops_per_device),
                   estimated_seconds(shapes, counts, topology))


def estimated_seconds(shapes: RunShapes, counts: list[tuple[Program, int]], topology: Topology) -> float | None:
    """One update by libtpu's cycle estimates (`program_seconds` of each program, times its runs); None off TPUs."""
    attention = attention_score_flops(shapes.model, shapes.rows, shapes.width, shapes.width) / len(topology.devices)
    each = [(program_seconds(program, topology, attention), times) for program, times in counts]
    return None if any(seconds is None for seconds, _ in each) else sum(seconds * times for seconds, times in each)


def program_seconds(program: Program, topology: Topology, attention_flops: float) -> float | None:
    """One run of `program` by libtpu's cycle estimates at the chip's clock, its Pallas kernels at their roofline
    (splash attention, which carries no cost estimate, at `attention_flops` per device, the analytic count),
    collectives left out; None off TPUs."""
    if program.estimate is None or not topology.chip.clock_hz:
        return None
    return program.estimate.seconds(topology.chip.clock_hz, topology.peak_flops_per_device,
                                    topology.hbm_bandwidth_per_device, splash_flops(program, attention_flops))


def splash_flops(program: Program, attention_flops: float) -> float:
    """The FLOPs of a program's splash attention calls, which XLA's cost analysis does not see, given a train
    step's analytic `attention_flops` (each attention's forward once and its backward at twice that): none
    without calls; that count plus another forward for every forward call beyond the backward ones (a layer
    under remat runs its attention's forward again in the backward pass); its forward third for a program
    with no backward calls."""
    forward, backward = program.splash_calls
    if not forward:
        return 0.0
    return attention_flops * (forward + 2 * backward) / (3 * backward) if backward else attention_flops / 3


def _kernels(programs: list[Program]) -> str:
    """What the train step's attention compiled to: kernel calls, or XLA's own attention."""
    train = [p for p in programs if p.name.startswith(("train step", "micro-step"))]
    if not train:
        return ""
    calls = max(p.attention_kernels for p in train)
    loss = max(p.loss_kernels for p in train)
    attention = f"{calls} attention kernel calls in the train step" if calls else "XLA's attention in the train step"
    return f" ({attention}; {loss} fused loss kernel calls)" if loss else f" ({attention})"


def _gb(size: float) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def table(topology: Topology, mesh: Mesh, shapes: RunShapes, programs: list[Program], result: Verdict,
          accumulation: int) -> str:
    """The report as plain-text lines."""
    devices = len(topology.devices)
    model = shapes.model
    gpu = topology.chip.is_gpu
    device = "GPU" if gpu else "device"
    where = (f"{topology.name}: {topology.chip.name}, {devices} GPU(s) on {topology.hosts} host" if gpu else
             f"{topology.name} x {topology.num_slices} slice(s): {topology.chip.name}, "
             f"{topology.chips} chips, {devices} devices, {topology.hosts} host processes")
    lines = [
        f"topology        {where}",
        f"mesh            data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']}",
        f"model           N={model.num_layers} d_model={model.d_model} d_ff={model.d_ff} h={model.num_heads} "
        f"vocab={model.vocab_size} dtype={model.dtype} remat={model.remat} scan_layers={model.scan_layers} "
        f"attention={model.attention_backend}" + _kernels(programs),
        f"batch           {shapes.rows} rows x {shapes.width} tokens per micro-step, x{accumulation} accumulation "
        f"= {accumulation * shapes.rows * shapes.width:,} target token slots per update; "
        f"{shapes.rows / devices:g} rows per {device}"
        + (f"\nshapes          {shapes.batches.describe()}" if shapes.batches else ""),
        "",
        f"{'program':<40} {'arguments':>11} {'outputs':>11} {'aliased':>11} {'temporaries':>12} {'total':>11} "
        f"{'TFLOP/GPU' if gpu else 'TFLOP/dev':>10}  collectives",
    ]
    for p in programs:
        collectives = ", ".join(f"{op} x{count} ({_gb(size)})" for op, (count, size) in sorted(p.collectives.items()))
        lines.append(f"{p.name:<40} {_gb(p.argument_bytes):>11} {_gb(p.output_bytes):>11} {_gb(p.alias_bytes):>11} "
                     f"{_gb(p.temp_bytes):>12} {_gb(p.total_bytes):>11} {p.flops / 1e12:>10.3f}  {collectives or '-'}")
    paper_days = PAPER_STEPS * PAPER_TOKENS_PER_STEP / result.tokens_per_second / 86400
    lines += [
        "",
        f"memory          peak {_gb(result.peak_bytes)} per {device} of {_gb(result.hbm_bytes)} HBM "
        f"({result.peak_bytes / result.hbm_bytes:.0%}): {'fits' if result.fits else 'does not fit'}",
        f"FLOPs/update    XLA {result.xla_flops / 1e12:.1f} TFLOP, analytic {result.analytic_flops / 1e12:.1f} TFLOP "
        f"(ratio {result.xla_flops / result.analytic_flops:.2f})"
        + ("; XLA's cost model run on this host over the optimized GPU program (the CUDA plugin gives none)"
           if gpu else ""),
        f"roofline        compute {result.compute_seconds * 1e3:.1f} ms (FLOPs at peak), memory "
        f"{result.memory_seconds * 1e3:.1f} ms (XLA's bytes accessed at HBM bandwidth) per update",
        f"predicted       {result.step_seconds * 1e3:.1f} ms per update, {result.tokens_per_second:,.0f} target "
        f"tokens/s (roofline at {topology.chip.name} peak {topology.chip.peak_bf16_flops / 1e12:.0f} TFLOP/s, "
        f"{topology.chip.hbm_bytes_per_second / 1e9:.0f} GB/s; assumes MFU {result.assumed_mfu:.0%})",
    ]
    if result.estimated_seconds:
        lines.append(f"compiler's own  {result.estimated_seconds * 1e3:.1f} ms per update by libtpu's cycle estimates "
                     f"at the {topology.chip.clock_hz / 1e9:.2f} GHz clock (Pallas kernels at their roofline, "
                     "collectives left out)")
    chip_key = next((key for key, chip in CHIPS.items() if chip == topology.chip), "")
    measured = measured_line(chip_key, model, shapes.rows / devices, shapes.width, result.step_seconds * 1e3)
    if measured and accumulation == 1:
        lines.append(measured)
    lines += [
        f"paper schedule  {PAPER_STEPS:,} steps x {PAPER_TOKENS_PER_STEP:,} tokens: {paper_days * 24:.1f} hours "
        "predicted (roofline: a lower bound)",
    ]
    if gpu and result.fits and result.peak_bytes > GPU_PREALLOCATED * result.hbm_bytes:
        lines.append(f"note            JAX preallocates {GPU_PREALLOCATED:.0%} of GPU memory "
                     f"({_gb(GPU_PREALLOCATED * result.hbm_bytes)}); to run this, set "
                     "XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (or XLA_PYTHON_CLIENT_PREALLOCATE=false)")
    return "\n".join(lines)


def search_line(program: Program, topology: Topology, rows: int, width: int, longest_output: int,
                processes: int = 0) -> str:
    """The compiled search as a translation speed: sentences/s for batches of `rows` sources of `width` tokens, and
    the hours 100M (BULK_SENTENCES) sentences take, between outputs as long as their sources (`width` steps) and
    the longest output the search allows (`longest_output` steps: a batch's loop runs until its last sentence is
    done, and beam search, stopping early only when no beam can improve, often runs to the end).

    `processes` > 0: the program is one host process's share of `translate-corpus` (each process translates its
    own shards on its own devices), so the job's rate is `processes` times the program's; 0: the program is the
    whole mesh's (the run's own search, as the score command splits a batch over every device).

    XLA's cost analysis counts the search's while loop body once, so the program's FLOPs and bytes are one decode
    step, at the roofline (a lower bound on its time); they include the encoder, which runs once a batch."""
    step_seconds = roofline_seconds(program, topology)
    copies = max(processes, 1)
    fast, slow = (copies * rows / (step_seconds * steps) for steps in (width, longest_output))
    job = "" if not processes else (
        " (translate-corpus)" if processes == 1 else
        f" (translate-corpus: {processes} processes, each this batch on its {len(topology.devices) // processes} "
        "devices)")
    return (f"search          {program.name}: {step_seconds * 1e3:#.3g} ms a decode step (roofline), outputs of "
            f"{width}-{longest_output} tokens: {slow:,.0f}-{fast:,.0f} sentences/s; {BULK_SENTENCES / 1e6:.0f}M "
            f"sentences{job} in {BULK_SENTENCES / fast / 3600:.1f}-{BULK_SENTENCES / slow / 3600:.1f} hours")


def advice(mesh: Mesh, shapes: RunShapes, accumulation: int) -> str:
    """What to change when a run does not fit, naming the settings."""
    hints = []
    if mesh.shape["fsdp"] < mesh.size:
        hints.append(f"shard parameters over more devices (--config.mesh.fsdp={min(mesh.size, 2 * mesh.shape['fsdp'])})")
    if shapes.model.remat == "none":
        hints.append("recompute activations (--config.model.remat=full)")
    if shapes.rows > mesh.size:
        hints.append(f"halve data.tokens_per_batch and set --config.training.accumulation_steps={2 * accumulation}")
    return "; or ".join(hints) or "use a topology with more memory per device"
