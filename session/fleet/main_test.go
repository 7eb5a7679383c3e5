package fleet_test

import (
	"os"
	"testing"
)

// TestMain lets this test binary stand in for the processes of the scale
// simulation (TestBenchScale): with envRole set it is an etcd member, a
// fleet host or a lone host, not a test run.
func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(scaleChild(role))
	}
	os.Exit(m.Run())
}
