# The operator image: Python 3.11 with the libvirt client library and the SSH client the qemu+ssh transport needs.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libvirt-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0 openssh-client \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin capi
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["capi-libvirt"]
CMD ["run"]
