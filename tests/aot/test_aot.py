"""Ahead-of-time compilation for TPU topologies on this CPU host (libtpu, the `tpu` extra).

A reduced model keeps each compile to seconds; what is checked is that the figures come from the
TPU compiler (memory, collectives) and that the verdict and its command line behave.
"""

import dataclasses
import json
import pathlib
import pickle
import runpy
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from runs import ROOT, tiny_run_config
from transformer_jax.aot.compile import Program, collectives_in, compile_run, splash_calls_in
from transformer_jax.aot.cycles import estimate_of
from transformer_jax.aot.report import search_line, splash_flops, table, verdict
from transformer_jax.aot.topology import CLOUD_TYPES, describe, host_devices, mesh_for
from transformer_jax.errors import ConfigError

pytest.importorskip("libtpu", reason="the tpu extra (libtpu) is installed by `make test`")


def small_run(**mesh):
    config = tiny_run_config()
    # Rows of 128: whole blocks of the splash kernel; on a corpus, widths chosen from it (the tiny run's rows are 64).
    config.data.update(tokens_per_batch=2048, max_length=128, row_width=0)
    config.model.update(d_model=64, d_ff=128, num_heads=4, max_len=256)
    config.mesh.update(**mesh)
    return config


def built_mesh(topology, data, fsdp):
    return mesh_for(topology, data, fsdp)


def named(programs, prefix):
    """The one program whose name starts with `prefix` (names end in their batch shape)."""
    [program] = [p for p in programs if p.name.startswith(prefix)]
    return program


def test_a_data_mesh_all_reduces_gradients_and_reports_memory(preflight_rows):
    """The programs the tiny-memory preflight (preflight_rows: small_run on v5e:2x2, its default mesh) compiled."""
    mesh_shape, shapes, programs = preflight_rows["compiled"]
    assert mesh_shape == {"data": 4, "fsdp": 1}  # data=-1: every device of the topology
    topology = describe("v5e:2x2")
    assert topology.chip.name == "TPU v5e" and len(topology.devices) == 4 and topology.hosts == 1
    train = named(programs, "train step ")
    assert train.argument_bytes > 0 and train.temp_bytes > 0 and train.total_bytes > train.argument_bytes
    assert train.alias_bytes > 0  # the state is donated: parameters and Adam moments are updated in place
    reductions = set(train.collectives) & {"all-reduce", "reduce-scatter"}
    assert reductions and train.collectives[sorted(reductions)[0]][1] > 0
    assert "all-gather" not in train.collectives  # parameters are replicated: nothing to gather
    rows, width = shapes.batches.dev_loss[0]
    assert named(programs, "dev loss ").name == f"dev loss {rows}x{width}"
    assert not named(programs, "beam search (beam 2").collectives  # each device decodes its own sentences
    result = verdict(shapes, programs, topology, accumulation=1)
    assert result.fits and 0.5 < result.xla_flops / result.analytic_flops < 3.0
    # attention_backend=auto on a TPU mesh: the train step calls the Pallas splash kernel (encoder self, decoder
    # self and cross attention, forward and backward), and the preflight's report says so.
    assert train.attention_kernels >= 3 * 2
    assert train.loss_kernels == 2  # training.loss_kernel=auto: the fused loss (statistics, table gradient)
    forward, backward = train.splash_calls  # one forward and one fused backward call per attention, no remat
    assert forward == backward > 0 and forward + backward == train.attention_kernels
    report = table(topology, built_mesh(topology, data=4, fsdp=1), shapes, programs, result, 1)
    assert "attention=auto (" in report and "attention kernel calls in the train step; 2 fused loss" in report
    # libtpu's own cycle estimates: every kernel call found, the loss kernels' cost estimates read, splash's absent.
    estimate = train.estimate
    assert estimate.cycles > 0 and estimate.kernel_calls == train.attention_kernels + train.loss_kernels
    assert estimate.unestimated_kernel_calls == train.attention_kernels and estimate.kernel_flops > 0
    assert result.estimated_seconds > estimate.cycles / topology.chip.clock_hz
    assert f"compiler's own  {result.estimated_seconds * 1e3:.1f} ms per update" in report


def test_cycle_estimates_count_each_loop_trip_and_every_kernel():
    hlo = "\n".join([
        "%body (p: f32[]) -> f32[] {",
        '  %f = f32[8] fusion(%p), kind=kLoop, backend_config={"estimated_cycles":"100"}',
        "}",
        "ENTRY %main (a: f32[]) -> f32[] {",
        '  %w = f32[] while(%a), body=%body, backend_config={"known_trip_count":{"n":"3"}}',
        '  %k = f32[8] custom-call(%a), custom_call_target="tpu_custom_call", backend_config={"custom_call_config":'
        '{"cost_estimate":{"flops":"2000","transcendentals":"0","bytes_accessed":"40"}}}',
        '  %s = f32[8] custom-call(%a), custom_call_target="tpu_custom_call", backend_config={}',
        '  %g = f32[8] fusion(%k), kind=kLoop, backend_config={"estimated_cycles":"50"}',
        "}",
    ])
    estimate = estimate_of(hlo)
    assert (estimate.cycles, estimate.kernel_calls, estimate.unestimated_kernel_calls) == (350, 2, 1)
    assert (estimate.kernel_flops, estimate.kernel_bytes) == (2000, 40)
    # 350 cycles at 1 kHz, the kernel's FLOPs at 1000/s (its bytes at 1000/s take less), 500 more FLOPs for splash.
    assert estimate.seconds(1e3, 1e3, 1e3, other_kernel_flops=500) == 0.35 + 2.0 + 0.5
    assert estimate_of(hlo.replace("estimated_cycles", "other")) is None


def test_an_fsdp_mesh_gathers_parameters(fsdp_command):
    """Read from the command's table (fsdp_command: v5e:2x2 as data=2 x fsdp=2), whose train-step row lists the
    collectives the TPU compiler put in that program."""
    assert "mesh            data=2 x fsdp=2" in fsdp_command.stdout
    [train] = [line for line in fsdp_command.stdout.splitlines() if line.startswith("train step ")]
    assert "all-gather" in train, train


def test_a_multi_host_topology_and_gradient_accumulation_compile():
    topology = describe("v5e:4x4")
    assert len(topology.devices) == 16 and topology.hosts == 4
    config = small_run(data=-1, fsdp=1)
    config.training.accumulation_steps = 2
    # The train programs alone: accumulation is theirs (the dev loss and search on v5e:4x4 compile in
    # multi_host_command's preflight).
    shapes, programs = compile_run(config, mesh_for(topology, -1, 1), which=("train",))
    names = [p.name for p in programs]
    assert names[:2] == [f"micro-step gradients {shapes.rows}x{shapes.width}", "apply accumulated gradients"]
    assert shapes.rows == 16 and shapes.rows % 16 == 0


def test_cloud_type_names_and_unknown_topologies():
    assert CLOUD_TYPES["v5e-256"] == "v5e:16x16" and CLOUD_TYPES["v4-128"] == "v4:4x4x4"
    assert describe("v5p-128").chips == 64
    with pytest.raises(ConfigError, match="unknown topology 'v9:2x2'; use a TPU topology as VERSION:AxB"):
        describe("v9:2x2")
    with pytest.raises(ConfigError, match=r"unknown TPU topology 'v5e:2x3' \(INVALID_ARGUMENT.*; use a TPU topology"):
        describe("v5e:2x3")  # of a valid form: libtpu judges it


def test_collectives_are_read_from_hlo_text():
    hlo = "\n".join([
        "  %all-reduce.1 = f32[512,2048]{1,0} all-reduce(f32[512,2048]{1,0} %p), channel_id=1",
        "  %ag = (bf16[8]{0}, bf16[32]{0}) all-gather-start(bf16[8]{0} %x), dimensions={0}",
        "  %ag.done = bf16[32]{0} all-gather-done((bf16[8]{0}, bf16[32]{0}) %ag)",
        "  %add = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)",
    ])
    assert collectives_in(hlo) == {"all-reduce": (1, 512 * 2048 * 4), "all-gather": (1, 32 * 2)}


def small_run_file(directory):
    """A config file of small_run() in `directory`, for the command line."""
    config = directory / "small.py"
    config.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                      "from aot.test_aot import small_run\n\ndef get_config():\n    return small_run()\n")
    return config


def run_aot(tmp_path, *args):
    config = small_run_file(tmp_path)
    return subprocess.run([sys.executable, "-m", "transformer_jax.aot", f"--config={config}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def record_compiles_of_rows(rows_file: str, results_file: str, compiled_file: str) -> None:
    """In the process preflight_rows starts: tests/cli_rows.py's `transformer-jax` command lines (each through the
    command's own flag parsing and main), and what each preflight's compile_run returned, as it returned it
    (mesh shape, shapes, programs), pickled in order to `compiled_file`."""
    from transformer_jax.aot import plan

    compiles, compile_run_itself = [], plan.compile_run

    def recorded(config, mesh, *args, **kwargs):
        shapes, programs = compile_run_itself(config, mesh, *args, **kwargs)
        compiles.append((dict(mesh.shape), shapes, programs))
        return shapes, programs

    plan.compile_run = recorded
    sys.argv = [str(ROOT / "tests" / "cli_rows.py"), "transformer-jax", rows_file, results_file]
    runpy.run_path(sys.argv[0], run_name="__main__")
    pathlib.Path(compiled_file).write_bytes(pickle.dumps(compiles))


@pytest.fixture(scope="module")
def preflight_rows(tmp_path_factory):
    """The preflight command lines below (`transformer-jax preflight` on a config file of small_run), all in one
    process (tests/cli_rows.py, as runs.run_rows runs it), in this order: {name: the finished command}, and
    "compiled": the (mesh shape, shapes, programs) the first, the tiny-memory preflight on v5e:2x2, compiled (only it
    and the fsdp preflight compile; the others stop at their flags)."""
    directory = tmp_path_factory.mktemp("preflight_rows")
    config = small_run_file(directory)
    rows = {
        "tiny memory": ["--topology=v5e:2x2", "--hbm_gb=0.001"],
        # v5e-4 (v5e:2x2) with fsdp=2 and translate-corpus's batching given as its flags (without them it is sized
        # for the devices: the batches line)
        "fsdp": ["--topology=v5e-4", "--config.mesh.fsdp=2", "--search_width=16", "--batch_tokens=512",
                 "--batch_size=64"],
        "mode without a width": ["--topology=v5e-4", "--mode=greedy"],
        "top_k with beam search": ["--topology=v5e-4", "--search_width=16", "--top_k=10"],
        "width 4096": ["--topology=v5e-4", "--search_width=4096"],
        "unknown topology": ["--topology=v9:2x2"],
    }
    rows_file, out, compiled_file = (directory / name for name in ("rows.json", "results.json", "compiled.pickle"))
    rows_file.write_text(json.dumps([["preflight", f"--config={config}", *args] for args in rows.values()]))
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); "
                           "from aot.test_aot import record_compiles_of_rows; record_compiles_of_rows(*sys.argv[1:])",
                           str(rows_file), str(out), str(compiled_file)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {name: subprocess.CompletedProcess(args, r["returncode"], r["stdout"], r["stderr"])
               for (name, args), r in zip(rows.items(), json.loads(out.read_text()))}
    [tiny_memory, fsdp] = pickle.loads(compiled_file.read_bytes())
    assert fsdp[0] == {"data": 2, "fsdp": 2}, fsdp[0]
    return {**results, "compiled": tiny_memory}


@pytest.fixture(scope="module")
def fsdp_command(preflight_rows):
    """The preflight of small_run on v5e-4 (v5e:2x2) with fsdp=2 and translate-corpus's batching given as its flags
    (a row of preflight_rows); test_an_fsdp_mesh_gathers_parameters reads its train step's collectives too."""
    return preflight_rows["fsdp"]


def test_the_command_prints_the_table_and_fits(fsdp_command):
    result = fsdp_command
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh            data=2 x fsdp=2" in result.stdout and "all-gather" in result.stdout
    assert "host input      not measured: no corpus" in result.stdout
    assert result.stdout.rstrip().endswith("fits")
    widest, bulk = [line for line in result.stdout.splitlines() if line.startswith("search ")]
    for line in (widest, bulk):
        assert "beam search (beam 2, alpha 0.6)" in line and "sentences/s" in line and "hours" in line, line
    assert "(translate-corpus)" in bulk and "translate-corpus" not in widest  # v5e-4 is one host process
    sized = [line for line in result.stdout.splitlines() if line.startswith("batches ")]
    assert len(sized) == 1 and "sized for 4 x TPU v5 lite (16 GB each) for beam search (beam 2" in sized[0], sized
    # 512 source tokens a batch at width 16: 32 rows (at most 64; a multiple of the 4 devices); outputs of 16 tokens
    # up to 16 + the tiny config's eval.max_extra_length
    assert "alpha 0.6) 32x16, float32:" in bulk and f"outputs of 16-{16 + small_run().eval.max_extra_length} tokens" \
        in bulk


def test_the_search_line_is_one_decode_step_at_the_roofline_times_the_output_lengths():
    topology = describe("v5e-8")
    compute_bound = Program("beam search (beam 4, alpha 0.6) 64x32", 0, 0, 0, 0, 0,
                            flops=topology.peak_flops_per_device * 1e-3,
                            bytes_accessed=topology.hbm_bandwidth_per_device * 5e-4, collectives={})
    # 1 ms a step (compute; memory 0.5 ms): 64 sentences in 32 to 64 steps, 2,000 to 1,000 sentences/s
    line = search_line(compute_bound, topology, rows=64, width=32, longest_output=64)
    assert "1.00 ms a decode step" in line and "outputs of 32-64 tokens: 1,000-2,000 sentences/s" in line, line
    assert "100M sentences in 13.9-27.8 hours" in line, line
    # One host process's share of a bulk job on each of 2 hosts: twice the program's rate
    line = search_line(compute_bound, topology, rows=64, width=32, longest_output=64, processes=2)
    assert "outputs of 32-64 tokens: 2,000-4,000 sentences/s" in line, line
    assert "100M sentences (translate-corpus: 2 processes, each this batch on its 4 devices) in 6.9-13.9 hours" in line
    line = search_line(compute_bound, topology, rows=64, width=32, longest_output=64, processes=1)
    assert "1,000-2,000 sentences/s; 100M sentences (translate-corpus) in 13.9-27.8 hours" in line, line
    memory_bound = dataclasses.replace(compute_bound, bytes_accessed=topology.hbm_bandwidth_per_device * 2e-3)
    line = search_line(memory_bound, topology, rows=64, width=32, longest_output=32)
    assert "2.00 ms a decode step" in line and ": 1,000-1,000 sentences/s" in line and " 27.8-27.8 hours" in line


MULTI_HOST_SEARCH = ("--search_width=16", "--mode=sample", "--top_k=10", "--temperature=0.7", "--dtype=bfloat16",
                     "--batch_size=64", "--batch_tokens=384", "--max_extra_length=8")


@pytest.fixture(scope="module")
def multi_host_command(tmp_path_factory):
    """One preflight of small_run on v5e:4x4 (4 host processes) that two tests read: on a prepared corpus (rows of up
    to 256 tokens, max_len 512), with translate-corpus's search flags (MULTI_HOST_SEARCH). The corpus sets the
    training shapes and the host-input and batch-content lines; the flags set the bulk search line alone. Returns
    (the corpus's directory, the finished process)."""
    from transformer_jax.data import prepare_corpus

    directory = tmp_path_factory.mktemp("multi_host")
    corpus = directory / "prepared"
    prepare_corpus(small_run(), str(corpus))
    result = run_aot(directory, "--topology=v5e:4x4", f"--config.data.prepared={corpus}",
                     "--config.data.max_length=256", "--config.model.max_len=512",
                     "--config.data.tokens_per_batch=8192", *MULTI_HOST_SEARCH)
    return corpus, result


def test_on_a_prepared_corpus_the_preflight_compiles_its_widths_and_times_one_host_s_input(multi_host_command):
    """v5e:4x4 is 4 host processes: the preflight times building one of their four blocks of rows."""
    from transformer_jax.aot.host_input import HostInput
    from transformer_jax.data import prepare_data

    config = small_run()
    corpus, result = multi_host_command
    assert result.returncode == 0, result.stderr[-3000:]
    config.data.update(prepared=str(corpus), max_length=256, tokens_per_batch=8192)
    config.model.max_len = 512
    shapes = prepare_data(config, None, row_multiple=16, platform="tpu").train.batch_shapes()
    assert f"shapes          train {', '.join(f'{r}x{w}' for r, w in shapes)};" in result.stdout
    assert all(width % 128 == 0 for _, width in shapes)  # TPU lanes (shapes.PLATFORM_WIDTH_MULTIPLES)
    on_cpu = prepare_data(config, None, row_multiple=16).train.batch_shapes()
    assert any(width % 128 for _, width in on_cpu)  # this corpus's short pairs get narrower rows on CPU
    [line] = [line for line in result.stdout.splitlines() if line.startswith("host input")]
    assert "ms per update to build one of 4 host processes' rows" in line, line
    assert HostInput(0.010, 4).line(0.005).endswith("(data.tokens_per_batch, accumulation)")  # slower than the chips
    assert "keeps input ahead" in HostInput(0.001, 4).line(0.005)
    [line] = [line for line in result.stdout.splitlines() if line.startswith("batch content")]
    assert "real target tokens per update (data.tokens_per_batch=8192 slots a side)" in line, line
    assert "fairseq's --max-tokens 8192 holds" in line and "holds as many as ours" in line, line


def test_a_tiny_memory_does_not_fit_and_names_what_to_change(preflight_rows):
    result = preflight_rows["tiny memory"]  # --topology=v5e:2x2 --hbm_gb=0.001
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.startswith("does not fit:") and "--config.mesh.fsdp=2" in last and "model.remat=full" in last


def test_the_bulk_line_prices_translate_corpus_s_search_flags_on_each_host_s_devices(multi_host_command):
    """v5e:4x4 is 4 host processes of 4 chips: translate-corpus's batch (MULTI_HOST_SEARCH) is split over one
    process's 4 devices (24 rows of 16 tokens in --batch_tokens=384, a multiple of 4; over all 16 devices it would be
    16 rows), and the 4 processes translate at 4 times its rate."""
    topology = describe("v5e:4x4")
    one_host = host_devices(topology)
    assert len(one_host) == 4 and len({device.process_index for device in one_host}) == 1
    _, result = multi_host_command
    assert result.returncode == 0, result.stderr[-3000:]
    widest, bulk = [line for line in result.stdout.splitlines() if line.startswith("search ")]
    assert widest.startswith("search          beam search (beam 2, alpha 0.6) "), widest  # the run's own search
    assert bulk.startswith("search          sampling (seed 0, temperature 0.7, top-k 10, top-p 1.0) 24x16, "
                           "bfloat16: "), bulk
    assert "outputs of 16-24 tokens" in bulk and "(translate-corpus: 4 processes, each this batch on its 4 devices)" \
        in bulk, bulk
    step_ms = float(bulk.split(": ")[1].split(" ms")[0])
    fastest = float(bulk.split("sentences/s")[0].split("-")[-1].replace(",", ""))
    assert fastest == pytest.approx(4 * 24 / (step_ms / 1e3 * 16), rel=0.01), bulk


def test_search_flags_without_a_search_width_are_one_line(preflight_rows):
    result = preflight_rows["mode without a width"]  # --topology=v5e-4 --mode=greedy
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "--mode prices translate-corpus's batch" in line and "--search_width=32" in line, line
    result = preflight_rows["top_k with beam search"]  # --topology=v5e-4 --search_width=16 --top_k=10
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "--top_k applies to --mode=sample" in line, line


def test_a_search_width_the_model_cannot_take_is_one_line(preflight_rows):
    result = preflight_rows["width 4096"]  # --topology=v5e-4 --search_width=4096
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "--search_width=4096" in line and "max_len of 256" in line, line


def test_an_unknown_topology_is_one_line(preflight_rows):
    result = preflight_rows["unknown topology"]  # --topology=v9:2x2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1 and "unknown topology 'v9:2x2'" in errors[0]
    assert "Traceback" not in result.stderr


def test_zero_slices_is_a_config_error():
    with pytest.raises(ConfigError, match="--num_slices=0 must be at least 1"):
        describe("v5e-4", num_slices=0)


def test_splash_flops_count_a_second_forward_under_remat():
    def call(kernel):
        return (f'  %c = bf16[8] custom-call(%q), custom_call_target="tpu_custom_call", '
                f'metadata={{op_name="jit(f)/{kernel}/pallas_call"}}')
    dq = "splash_mha_dq"  # an unfused dQ call is neither a forward nor a dK/dV call
    hlo = "\n".join([call("splash_mha_fwd_segmented_residuals")] * 4 + [call("splash_mha_dkv_segmented")] * 2
                    + [call(dq), '  %d = f32[8] fusion(%c), kind=kLoop'])
    assert splash_calls_in(hlo) == (4, 2)
    program = Program("train step", 0, 0, 0, 0, 0, 1.0, 1.0, {}, attention_kernels=7, splash_calls=(4, 2))
    # Two attentions: the analytic count is 2 x (forward + backward at twice the forward); remat adds 2 forwards.
    assert splash_flops(program, 600.0) == pytest.approx(800.0)
    assert splash_flops(dataclasses.replace(program, splash_calls=(2, 2)), 600.0) == pytest.approx(600.0)
    assert splash_flops(dataclasses.replace(program, splash_calls=(0, 0)), 600.0) == 0.0  # XLA's attention, GPUs
    assert splash_calls_in(hlo.replace("tpu_custom_call", "__cudnn$fmhaSoftmax")) == (0, 0)


class _TilesFailAtFirst:
    """A lowered program whose first compile fails as XLA:GPU's compile-only Triton GEMM does for some shapes."""

    def __init__(self, lowered, message: str) -> None:
        self.lowered, self.message, self.options = lowered, message, []

    def compile(self, compiler_options=None):
        self.options.append(compiler_options)
        if compiler_options is None:
            raise jax.errors.JaxRuntimeError(self.message)
        return self.lowered.compile(compiler_options=compiler_options)


def test_a_program_whose_triton_gemm_finds_no_tiles_compiles_with_cublas_and_says_so(capsys):
    from transformer_jax.aot.compile import WITHOUT_TRITON_GEMM, compile_lowered

    lowered = jax.jit(lambda a, b: a @ b).lower(jnp.ones((8, 8)), jnp.ones((8, 8)))
    failing = _TilesFailAtFirst(lowered, "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.230 = ...")
    compiled = compile_lowered("dev loss 56x64", failing)
    assert failing.options == [None, WITHOUT_TRITON_GEMM]
    assert float(compiled(jnp.ones((8, 8)), jnp.ones((8, 8)))[0, 0]) == 8.0
    assert "dev loss 56x64: XLA's Triton GEMM found no tiles" in capsys.readouterr().out
    other = _TilesFailAtFirst(lowered, "RESOURCE_EXHAUSTED: out of memory")
    with pytest.raises(jax.errors.JaxRuntimeError, match="out of memory"):
        compile_lowered("train step", other)
    assert other.options == [None]
