package cloudhypervisor

// The generated client lives in internal/chapi. The spec path is relative to
// this directory: shared/ sits beside the berth clone, both in the dev
// workspace and in CI.
//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config internal/chapi/oapi-codegen.yaml ../../../shared/cloud-hypervisor/openapi-v53.0.yaml
