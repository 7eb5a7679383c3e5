package oci

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
)

// plan is an image resolved in its source: what to import.
type plan struct {
	digest string       // the manifest's, or a docker image id
	config *imageConfig // nil for a rootfs tarball
	layers []*layerRef
	// configJSON and manifestJSON are the config and (an OCI image's)
	// manifest as the source had them, checked, kept for export.
	configJSON, manifestJSON []byte
}

// Annotations naming an image in a layout.
const (
	annotRefName   = "org.opencontainers.image.ref.name"
	annotImageName = "io.containerd.image.name"
	annotRefType   = "vnd.docker.reference.type" // "attestation-manifest"
)

// candidate is an image manifest an index offers.
type candidate struct {
	desc Descriptor
	refs []string
}

// walk collects the runnable image manifests of an index, and what it
// holds that is not one, for the message when none is.
type walk struct {
	set       fileSet
	cands     []candidate
	platforms []string // other platforms seen
	unknown   []string // media types not read
}

func (w *walk) index(ix *index, refs []string, depth int) error {
	if depth > maxIndexDepth {
		return fmt.Errorf("image indexes nested over %d deep", maxIndexDepth)
	}
	for _, d := range ix.Manifests {
		if d.Annotations[annotRefType] != "" || d.Platform != nil && d.Platform.OS == "unknown" {
			continue // an attestation, not an image
		}
		if d.Platform != nil && !d.Platform.runnable() {
			w.platforms = append(w.platforms, d.Platform.String())
			continue
		}
		names := refs
		for _, a := range []string{annotRefName, annotImageName} {
			if r := d.Annotations[a]; r != "" {
				names = append(slices.Clip(names), r)
			}
		}
		mt := d.MediaType
		if mt == "" {
			b, err := readBlob(w.set, d, maxJSON)
			if err != nil {
				return err
			}
			var probe struct {
				MediaType string          `json:"mediaType"`
				Manifests json.RawMessage `json:"manifests"`
			}
			json.Unmarshal(b, &probe)
			mt = probe.MediaType
			if mt == "" && probe.Manifests != nil {
				mt = mtOCIIndex
			} else if mt == "" {
				mt = mtOCIManifest
			}
		}
		switch mt {
		case mtOCIIndex, mtDockerList:
			b, err := readBlob(w.set, d, maxJSON)
			if err != nil {
				return err
			}
			sub, err := parseIndex(b)
			if err != nil {
				return err
			}
			if err := w.index(sub, names, depth+1); err != nil {
				return err
			}
		case mtOCIManifest, mtDockerV2:
			d.MediaType = mt
			w.cands = append(w.cands, candidate{desc: d, refs: names})
		default:
			w.unknown = append(w.unknown, clip(mt))
		}
	}
	return nil
}

// matches reports whether a candidate is named ref: by its whole name
// (docker.io/library/app:1), its tag (1) or its name and tag (app:1).
func (c candidate) matches(ref string) bool {
	for _, r := range c.refs {
		if r == ref || strings.HasSuffix(r, "/"+ref) || strings.HasSuffix(r, ":"+ref) {
			return true
		}
	}
	return false
}

// resolveOCI picks the linux/amd64 image of a layout.
func resolveOCI(set fileSet, ref string) (*plan, error) {
	if b, err := readSmall(set, "oci-layout", 4096); err == nil {
		var l struct {
			Version string `json:"imageLayoutVersion"`
		}
		if err := decodeJSON(b, &l); err != nil {
			return nil, fmt.Errorf("oci-layout: %w", err)
		}
		if !strings.HasPrefix(l.Version, "1.") {
			return nil, fmt.Errorf("OCI image layout version %q is not one berth reads (1.x)", clip(l.Version))
		}
	}
	b, err := readSmall(set, "index.json", maxJSON)
	if err != nil {
		return nil, err
	}
	ix, err := parseIndex(b)
	if err != nil {
		return nil, err
	}
	w := &walk{set: set}
	if err := w.index(ix, nil, 0); err != nil {
		return nil, err
	}
	cands := w.cands
	if ref != "" {
		cands = slices.DeleteFunc(slices.Clone(cands), func(c candidate) bool { return !c.matches(ref) })
	}
	// One image under several names is one image.
	seen := map[string]bool{}
	cands = slices.DeleteFunc(cands, func(c candidate) bool {
		dup := seen[c.desc.Digest]
		seen[c.desc.Digest] = true
		return dup
	})
	switch {
	case len(cands) == 1:
	case len(cands) > 1:
		return nil, fmt.Errorf("the source holds %d linux/amd64 images (%s): name the one to import", len(cands), names(cands))
	case ref != "" && len(w.cands) > 0:
		return nil, fmt.Errorf("the source holds no image named %q (it holds %s)", clip(ref), names(w.cands))
	case len(w.platforms) > 0:
		return nil, fmt.Errorf("the source holds no linux/amd64 image, only %s: berth runs linux/amd64 images only", list(w.platforms))
	case len(w.unknown) > 0:
		return nil, fmt.Errorf("the source holds no image berth can read: media type %s", list(w.unknown))
	default:
		return nil, fmt.Errorf("the source's index lists no image")
	}
	d := cands[0].desc
	mb, err := readBlob(set, d, maxJSON)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(mb)
	if err != nil {
		return nil, err
	}
	cb, err := readBlob(set, m.Config, maxJSON)
	if err != nil {
		return nil, err
	}
	cfg, err := parseConfig(cb, len(m.Layers))
	if err != nil {
		return nil, err
	}
	p := &plan{digest: d.Digest, config: cfg, configJSON: cb}
	if d.MediaType == mtOCIManifest {
		p.manifestJSON = mb
	}
	for i, ld := range m.Layers {
		comp, _ := layerCompression(ld.MediaType) // checked by parseManifest
		name := blobPath(ld.Digest)
		p.layers = append(p.layers, &layerRef{
			n: i + 1, of: len(m.Layers),
			open:   func() (io.ReadCloser, int64, error) { return set.open(name) },
			digest: ld.Digest, size: ld.Size, comp: comp,
			diffID: cfg.RootFS.DiffIDs[i],
		})
	}
	return p, nil
}

// resolveDocker picks the image of a docker save archive.
func resolveDocker(set fileSet, ref string) (*plan, error) {
	b, err := readSmall(set, "manifest.json", maxJSON)
	if err != nil {
		return nil, err
	}
	ms, err := parseDockerManifest(b)
	if err != nil {
		return nil, err
	}
	var tags []string
	for _, m := range ms {
		tags = append(tags, m.RepoTags...)
	}
	if ref != "" {
		ms = slices.DeleteFunc(ms, func(m dockerManifest) bool {
			return !(candidate{refs: m.RepoTags}).matches(ref)
		})
		if len(ms) == 0 {
			return nil, fmt.Errorf("the archive holds no image tagged %q (it holds %s)", clip(ref), list(tags))
		}
	}
	if len(ms) > 1 {
		return nil, fmt.Errorf("the archive holds %d images (%s): name the one to import", len(ms), list(tags))
	}
	m := ms[0]
	cname, ok := archivePath(m.Config)
	if !ok {
		return nil, fmt.Errorf("docker archive: bad config path %q", clip(m.Config))
	}
	cb, err := readSmall(set, cname, maxJSON)
	if err != nil {
		return nil, fmt.Errorf("docker archive: %w", err)
	}
	digest := sha256Digest(cb)
	if want := digestFromName(cname); want != "" && want != digest {
		return nil, fmt.Errorf("docker archive: config %s hashes to %s: the archive is corrupt", clip(cname), short(digest))
	}
	cfg, err := parseConfig(cb, len(m.Layers))
	if err != nil {
		return nil, err
	}
	p := &plan{digest: digest, config: cfg, configJSON: cb}
	for i, lp := range m.Layers {
		name, ok := archivePath(lp)
		if !ok {
			return nil, fmt.Errorf("docker archive: bad layer path %q", clip(lp))
		}
		p.layers = append(p.layers, &layerRef{
			n: i + 1, of: len(m.Layers),
			open:   func() (io.ReadCloser, int64, error) { return set.open(name) },
			digest: digestFromName(name), size: -1, comp: sniff,
			diffID: cfg.RootFS.DiffIDs[i],
		})
	}
	return p, nil
}

// resolveRootFS makes a one-layer plan of a root filesystem tarball.
// Its diff id and digest are known once it is scanned.
func resolveRootFS(f *os.File) (*plan, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	return &plan{layers: []*layerRef{{
		n: 1, of: 1,
		open: func() (io.ReadCloser, int64, error) {
			return io.NopCloser(io.NewSectionReader(f, 0, size)), size, nil
		},
		size: size, comp: sniff,
	}}}, nil
}

// digestFromName is the digest a docker archive's file name states:
// blobs/sha256/<hex> (docker 25 and later), <hex>.json or sha256:<hex>
// (a config, before); "" for a name that states none (a legacy <id>/layer.tar,
// whose id is not its digest).
func digestFromName(name string) string {
	if h, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
		if _, _, err := parseDigest("sha256:" + h); err == nil {
			return "sha256:" + h
		}
	}
	if _, _, err := parseDigest(name); err == nil && strings.HasPrefix(name, "sha256:") {
		return name // go-containerregistry names a config so
	}
	if h, ok := strings.CutSuffix(name, ".json"); ok && !strings.Contains(h, "/") {
		if _, _, err := parseDigest("sha256:" + h); err == nil {
			return "sha256:" + h
		}
	}
	return ""
}

func names(cs []candidate) string {
	var out []string
	for _, c := range cs {
		if len(c.refs) > 0 {
			out = append(out, c.refs...)
		} else {
			out = append(out, short(c.desc.Digest))
		}
	}
	return list(out)
}

// list joins a few names for a message.
func list(s []string) string {
	s = slices.Clone(s)
	sort.Strings(s)
	s = slices.Compact(s)
	if len(s) > 8 {
		s = append(s[:8], fmt.Sprintf("and %d more", len(s)-8))
	}
	for i := range s {
		s[i] = clip(s[i])
	}
	return strings.Join(s, ", ")
}
