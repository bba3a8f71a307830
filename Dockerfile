# The transformer-jax command in a container image, for the Kubernetes launch of docs/scaling.md (a JobSet on GKE,
# or XPK). It installs what a TPU or GPU host of that page installs, from this checkout:
#   docker build --build-arg JAX_EXTRA=tpu -t IMAGE:tpu .         TPU slices (libtpu)
#   docker build --build-arg JAX_EXTRA=cuda12 -t IMAGE:cuda12 .   NVIDIA GPUs on CUDA 12 (cuda13 alike)
# tests/test_kubernetes_recipe.py keeps these install lines those of the Makefile and docs/scaling.md.
FROM python:3.11-slim

# JAX's extra for the accelerator (tpu, cuda12 or cuda13), pinned to the jax that the package's install chose.
ARG JAX_EXTRA=tpu
# Python writes each log line at once, so that `kubectl logs` shows it as the run prints it.
ENV PYTHONUNBUFFERED=1

WORKDIR /opt/transformer_jax
# The versions the test suite ran with: every pip install below takes its versions from them (-c), so that two
# builds install the same packages. Packages it does not list (JAX's accelerator plugins) are not constrained.
COPY constraints.txt ./
COPY pyproject.toml README.md ./
COPY configs configs
COPY transformer_jax transformer_jax
# The train extra (the transformer-jax command, as `make demo` installs it) and gcs (gs:// workdirs); not editable.
RUN pip install --no-cache-dir -c constraints.txt '.[train,gcs]'
RUN pip install --no-cache-dir -c constraints.txt "jax[${JAX_EXTRA}]==$(python -c 'import jax; print(jax.__version__)')"

# The command runs as this user, not root; by its uid, so that a pod's runAsNonRoot can check it. Its home holds the
# libraries' caches, and the working directory is its own, for a run with a relative --workdir.
RUN useradd --create-home --uid 1000 transformer && chown transformer: /opt/transformer_jax
USER 1000

ENTRYPOINT ["transformer-jax"]
CMD ["--help"]
