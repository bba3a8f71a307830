# The transformer-jax command in a container image, for the Kubernetes launch of docs/scaling.md (a JobSet on GKE,
# or XPK). It installs what a TPU or GPU host of that page installs, from this checkout:
#   docker build --build-arg JAX_EXTRA=tpu -t IMAGE:tpu .         TPU slices (libtpu)
#   docker build --build-arg JAX_EXTRA=cuda12 -t IMAGE:cuda12 .   NVIDIA GPUs on CUDA 12 (cuda13 alike)
# tests/test_kubernetes_recipe.py keeps these install lines those of the Makefile and docs/scaling.md.
FROM python:3.11-slim

# JAX's extra for the accelerator (tpu, cuda12 or cuda13), pinned to the jax that the package's install chose.
ARG JAX_EXTRA=tpu

WORKDIR /opt/transformer_jax
COPY pyproject.toml README.md ./
COPY configs configs
COPY transformer_jax transformer_jax
# The train extra (the transformer-jax command, as `make demo` installs it) and gcs (gs:// workdirs); not editable.
RUN pip install --no-cache-dir '.[train,gcs]'
RUN pip install --no-cache-dir "jax[${JAX_EXTRA}]==$(python -c 'import jax; print(jax.__version__)')"

ENTRYPOINT ["transformer-jax"]
CMD ["--help"]
