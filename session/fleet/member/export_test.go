package member

import (
	"os"
	"path/filepath"
)

func removeMarker(dir string) error { return os.Remove(filepath.Join(dir, markerFile)) }
