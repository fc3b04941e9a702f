# The operator image: Python 3.11 with the libvirt client library and the SSH client the qemu+ssh transport needs.
# Versions are pinned (base image tag, Debian 12 packages); `make lint` checks this file with hadolint.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# libvirt-python compiles against libvirt's headers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      gcc=4:12.2.0-3 libc6-dev=2.36-9+deb12u14 libvirt-dev=9.0.0-4+deb12u2 pkg-config=1.8.1-1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, from the hashed lock (a layer that changes only with the lock), then the product without deps.
COPY requirements.lock ./
RUN pip install --no-cache-dir --prefix=/install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --prefix=/install --no-deps .

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0=9.0.0-4+deb12u2 openssh-client=1:9.2p1-2+deb12u10 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin capi
COPY --from=build /install /usr/local
USER 65532:65532
# Metrics and health (config/manager/manager.yaml's ports).
EXPOSE 8080 8081
ENTRYPOINT ["capi-libvirt"]
CMD ["run"]
