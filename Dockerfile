# greyrelay container image.
#
# Build with the public Go image:      docker build -t greyrelay .
# or with a locally made builder base: docker build --build-arg GO_IMAGE=local/golang:bookworm -t greyrelay .
# (integration/testdata/docker/build-base.sh makes such a base without a registry).
#
# The final image holds only the static binary, CA certificates and an empty
# spool directory owned by the non-root user. It runs with a read-only root
# filesystem and no capabilities: it listens on unprivileged ports (2525 for
# SMTP, 8025 for admin) that the operator maps, and keeps its queue on the
# /var/spool/greyrelay volume:
#
#   docker run --read-only --cap-drop ALL -v greyrelay-spool:/var/spool/greyrelay \
#     -p 25:2525 -e GREYRELAY_DELIVERY_SMARTHOST_ADDRESS=... greyrelay
ARG GO_IMAGE=golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
# Marks this stage's images so that a test (or an operator) can remove the
# builder layers the classic builder keeps: docker image prune --filter label=greyrelay.stage=build
LABEL greyrelay.stage=build
# GOPROXY may point the module download at a local mirror (the tests serve
# the host's module cache on loopback); empty means Go's default.
ARG GOPROXY
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=local
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The spool directory is created here and copied with its owner: a new named
# volume mounted over it takes the image's ownership, so the non-root user
# can write its queue there without any chown at run time.
RUN go build -ldflags="-s -w" -o /out/greyrelay ./cmd/greyrelay \
 && mkdir -p /out/spool /out/etc \
 && cp /etc/ssl/certs/ca-certificates.crt /out/ca-certificates.crt

FROM scratch
LABEL org.opencontainers.image.title="greyrelay" \
      org.opencontainers.image.description="Greylisting-aware, retrying SMTP relay" \
      org.opencontainers.image.source="https://github.com/greyrelay/greyrelay"
COPY --from=build /out/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/greyrelay /greyrelay
COPY --from=build --chown=65532:65532 /out/spool /var/spool/greyrelay
COPY --from=build /out/etc /etc/greyrelay
# A numeric user: scratch has no /etc/passwd, and a number lets Kubernetes'
# runAsNonRoot check it.
USER 65532:65532
# Configuration: mount a file at /etc/greyrelay/greyrelay.yaml (read from
# there; GREYRELAY_CONFIG names another path), or set keys through GREYRELAY_* variables (which
# win over the file's: so only what every container needs is set here; the
# admin server keeps the default, the container's own 127.0.0.1:8025). The
# defaults below trust no client address (behind Docker's NAT every client
# looks like the bridge gateway): every client must authenticate, so set
# GREYRELAY_USERS_FILE (a mounted secret) and a TLS certificate or
# allow_plaintext_auth behind a TLS-terminating proxy.
ENV GREYRELAY_QUEUE_PATH=/var/spool/greyrelay/queue.db \
    GREYRELAY_LOG_FORMAT=json \
    GREYRELAY_LISTENERS_0_ADDRESS=0.0.0.0:2525 \
    GREYRELAY_TRUSTED_NETWORKS=
VOLUME ["/var/spool/greyrelay"]
EXPOSE 2525 8025
# `greyrelay health` asks the running relay's admin server (the same
# configuration tells it where), so no shell or curl is needed in the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["/greyrelay", "health"]
# The relay finishes the SMTP sessions in progress and closes the queue on
# SIGTERM; docker stop's default 10 s grace covers that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/greyrelay"]
CMD ["serve"]
