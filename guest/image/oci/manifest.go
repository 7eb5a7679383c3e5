package oci

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strings"
)

// Media types berth reads. Anything else in a manifest is refused by
// name: a layer berth cannot unpack would make an image that is not the
// one asked for.
const (
	mtOCIIndex      = "application/vnd.oci.image.index.v1+json"
	mtOCIManifest   = "application/vnd.oci.image.manifest.v1+json"
	mtOCIConfig     = "application/vnd.oci.image.config.v1+json"
	mtDockerList    = "application/vnd.docker.distribution.manifest.list.v2+json"
	mtDockerV2      = "application/vnd.docker.distribution.manifest.v2+json"
	mtDockerConfig  = "application/vnd.docker.container.image.v1+json"
	mtOCILayer      = "application/vnd.oci.image.layer.v1.tar"
	mtOCILayerGzip  = "application/vnd.oci.image.layer.v1.tar+gzip"
	mtOCILayerZstd  = "application/vnd.oci.image.layer.v1.tar+zstd"
	mtOCIForeign    = "application/vnd.oci.image.layer.nondistributable.v1.tar"
	mtOCIForeignGz  = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
	mtOCIForeignZst = "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
	mtDockerLayer   = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	mtDockerForeign = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
)

// Bounds on what a source may make berth read into memory or do.
const (
	maxJSON       = 8 << 20 // a manifest, index or config
	maxLayers     = 256     // docker refuses more than 127
	maxIndexDepth = 4       // an index naming an index naming…
	maxIndexSize  = 4096    // entries of one index
	maxEnv        = 4096
	maxStrings    = 4096 // Entrypoint, Cmd
	maxString     = 64 << 10
)

// compression is how a layer's tar is packed.
type compression int

const (
	uncompressed compression = iota
	gzipped
	zstded
	sniff // a docker archive says nothing: look at the bytes
)

// layerCompression maps a layer media type to how it is packed, or
// refuses it.
func layerCompression(mt string) (compression, error) {
	switch mt {
	case mtOCILayer, mtOCIForeign:
		return uncompressed, nil
	case mtOCILayerGzip, mtOCIForeignGz, mtDockerLayer, mtDockerForeign:
		return gzipped, nil
	case mtOCILayerZstd, mtOCIForeignZst:
		return zstded, nil
	}
	return 0, fmt.Errorf("media type %q is not a layer berth can unpack (tar, tar+gzip, tar+zstd)", clip(mt))
}

// Descriptor points at a blob by digest (OCI image-spec descriptor).
type Descriptor struct {
	MediaType    string            `json:"mediaType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	Platform     *Platform         `json:"platform,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	ArtifactType string            `json:"artifactType,omitempty"`
}

// Platform is where an image runs.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

func (p Platform) String() string {
	s := clip(p.OS) + "/" + clip(p.Architecture)
	if p.Variant != "" {
		s += "/" + clip(p.Variant)
	}
	return s
}

// runnable reports whether berth's guests run the platform: x86-64
// Linux, any micro-architecture level.
func (p Platform) runnable() bool { return p.OS == "linux" && p.Architecture == "amd64" }

// index is an OCI image index or a docker manifest list.
type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Manifests     []Descriptor `json:"manifests"`
}

// manifest is an OCI image manifest or a docker v2 schema 2 manifest.
type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// imageConfig is the part of an image config berth reads.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
	Config       struct {
		Env        []string `json:"Env"`
		User       string   `json:"User"`
		WorkingDir string   `json:"WorkingDir"`
		Entrypoint []string `json:"Entrypoint"`
		Cmd        []string `json:"Cmd"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// dockerManifest is one image of a docker save archive's manifest.json.
type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// decodeJSON decodes b, which the caller has bounded, into v: one JSON
// value and nothing after it.
func decodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}

// parseIndex reads an OCI index (index.json, or a blob) and checks it.
func parseIndex(b []byte) (*index, error) {
	var ix index
	if err := decodeJSON(b, &ix); err != nil {
		return nil, fmt.Errorf("image index: %w", err)
	}
	if ix.SchemaVersion != 2 {
		return nil, fmt.Errorf("image index: schema version %d, want 2", ix.SchemaVersion)
	}
	if ix.MediaType != "" && ix.MediaType != mtOCIIndex && ix.MediaType != mtDockerList {
		return nil, fmt.Errorf("image index: media type %q is not an index", clip(ix.MediaType))
	}
	if len(ix.Manifests) > maxIndexSize {
		return nil, fmt.Errorf("image index: %d entries, over the limit of %d", len(ix.Manifests), maxIndexSize)
	}
	for _, d := range ix.Manifests {
		if err := d.check(); err != nil {
			return nil, fmt.Errorf("image index: %w", err)
		}
	}
	return &ix, nil
}

// parseManifest reads an image manifest and checks it.
func parseManifest(b []byte) (*manifest, error) {
	var m manifest
	if err := decodeJSON(b, &m); err != nil {
		return nil, fmt.Errorf("image manifest: %w", err)
	}
	if m.SchemaVersion != 2 {
		return nil, fmt.Errorf("image manifest: schema version %d, want 2 (docker's schema 1 is not read)", m.SchemaVersion)
	}
	if m.MediaType != "" && m.MediaType != mtOCIManifest && m.MediaType != mtDockerV2 {
		return nil, fmt.Errorf("image manifest: media type %q is not an image manifest", clip(m.MediaType))
	}
	if err := m.Config.check(); err != nil {
		return nil, fmt.Errorf("image manifest: config: %w", err)
	}
	switch m.Config.MediaType {
	case mtOCIConfig, mtDockerConfig:
	default:
		return nil, fmt.Errorf("image manifest: config media type %q is not a container image's (an artifact?)", clip(m.Config.MediaType))
	}
	if len(m.Layers) == 0 {
		return nil, errors.New("the image has no layers: there is nothing to boot")
	}
	if len(m.Layers) > maxLayers {
		return nil, fmt.Errorf("image manifest: %d layers, over the limit of %d", len(m.Layers), maxLayers)
	}
	for i, d := range m.Layers {
		if err := d.check(); err != nil {
			return nil, fmt.Errorf("image manifest: layer %d: %w", i+1, err)
		}
		if _, err := layerCompression(d.MediaType); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i+1, err)
		}
	}
	return &m, nil
}

// parseConfig reads an image config and checks what berth uses of it.
// layers is how many layers the manifest lists (-1: not known yet).
func parseConfig(b []byte, layers int) (*imageConfig, error) {
	var c imageConfig
	if err := decodeJSON(b, &c); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	p := Platform{OS: c.OS, Architecture: c.Architecture, Variant: c.Variant}
	if !p.runnable() {
		return nil, fmt.Errorf("the image is for %s: berth runs linux/amd64 images only", p)
	}
	if c.RootFS.Type != "layers" {
		return nil, fmt.Errorf("image config: rootfs type %q, want \"layers\"", clip(c.RootFS.Type))
	}
	if len(c.RootFS.DiffIDs) == 0 {
		return nil, errors.New("the image has no layers: there is nothing to boot")
	}
	if len(c.RootFS.DiffIDs) > maxLayers {
		return nil, fmt.Errorf("image config: %d layers, over the limit of %d", len(c.RootFS.DiffIDs), maxLayers)
	}
	if layers >= 0 && len(c.RootFS.DiffIDs) != layers {
		return nil, fmt.Errorf("image config lists %d layers and the manifest %d: the image is inconsistent", len(c.RootFS.DiffIDs), layers)
	}
	for i, d := range c.RootFS.DiffIDs {
		if _, _, err := parseDigest(d); err != nil {
			return nil, fmt.Errorf("image config: layer %d: %w", i+1, err)
		}
	}
	cc := &c.Config
	if len(cc.Env) > maxEnv || len(cc.Entrypoint) > maxStrings || len(cc.Cmd) > maxStrings {
		return nil, errors.New("image config: Env, Entrypoint or Cmd has too many entries")
	}
	for _, e := range cc.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsRune(e, 0) || len(e) > maxString {
			return nil, fmt.Errorf("image config: Env entry %q is not NAME=value", clip(e))
		}
	}
	for _, s := range slices.Concat(cc.Entrypoint, cc.Cmd, []string{cc.User, cc.WorkingDir}) {
		if strings.ContainsRune(s, 0) || len(s) > maxString {
			return nil, fmt.Errorf("image config: %q holds a NUL or is too long", clip(s))
		}
	}
	if cc.WorkingDir != "" && !strings.HasPrefix(cc.WorkingDir, "/") {
		return nil, fmt.Errorf("image config: WorkingDir %q is not absolute", clip(cc.WorkingDir))
	}
	return &c, nil
}

// parseDockerManifest reads a docker save archive's manifest.json.
func parseDockerManifest(b []byte) ([]dockerManifest, error) {
	var ms []dockerManifest
	if err := decodeJSON(b, &ms); err != nil {
		return nil, fmt.Errorf("docker archive manifest.json: %w", err)
	}
	if len(ms) == 0 {
		return nil, errors.New("docker archive manifest.json lists no image")
	}
	if len(ms) > maxIndexSize {
		return nil, fmt.Errorf("docker archive manifest.json: %d images, over the limit of %d", len(ms), maxIndexSize)
	}
	for _, m := range ms {
		if m.Config == "" {
			return nil, errors.New("docker archive manifest.json: an image without a config")
		}
		if len(m.Layers) == 0 {
			return nil, errors.New("the image has no layers: there is nothing to boot")
		}
		if len(m.Layers) > maxLayers {
			return nil, fmt.Errorf("docker archive manifest.json: %d layers, over the limit of %d", len(m.Layers), maxLayers)
		}
	}
	return ms, nil
}

// check validates a descriptor's digest and size.
func (d Descriptor) check() error {
	if _, _, err := parseDigest(d.Digest); err != nil {
		return err
	}
	if d.Size < 0 {
		return fmt.Errorf("descriptor %s has a negative size", d.Digest)
	}
	return nil
}

// parseDigest splits "algorithm:hex", accepting sha256 and sha512.
func parseDigest(d string) (alg, hexPart string, err error) {
	alg, hexPart, ok := strings.Cut(d, ":")
	want := 0
	switch alg {
	case "sha256":
		want = 64
	case "sha512":
		want = 128
	}
	if !ok || want == 0 {
		return "", "", fmt.Errorf("digest %q: want sha256:<hex> or sha512:<hex>", clip(d))
	}
	if len(hexPart) != want {
		return "", "", fmt.Errorf("digest %q: want %d hex digits", clip(d), want)
	}
	for _, c := range hexPart {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", "", fmt.Errorf("digest %q: not lower-case hex", clip(d))
		}
	}
	return alg, hexPart, nil
}

// newHash returns the hash a (checked) digest is computed with.
func newHash(digest string) hash.Hash {
	if strings.HasPrefix(digest, "sha512:") {
		return sha512.New()
	}
	return sha256.New()
}

func sum(h hash.Hash, digest string) string {
	alg, _, _ := strings.Cut(digest, ":")
	return alg + ":" + hex.EncodeToString(h.Sum(nil))
}

// sha256Digest is the digest of b.
func sha256Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// chainIDs computes each layer's ChainID (OCI image-spec, config.md):
// what the stack up to and including it is, which is what a layer
// applied over it depends on.
func chainIDs(diffIDs []string) []string {
	out := make([]string, len(diffIDs))
	for i, d := range diffIDs {
		if i == 0 {
			out[i] = d
			continue
		}
		out[i] = sha256Digest([]byte(out[i-1] + " " + d))
	}
	return out
}

// short shortens a digest for people: "sha256:0123456789ab".
func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// clip bounds a string from the source before it goes into a message.
func clip(s string) string {
	const n = 120
	if len(s) > n {
		s = s[:n] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
