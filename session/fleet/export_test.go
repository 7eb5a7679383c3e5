package fleet

// crash ends the keeper without revoking the lease, as a SIGKILL of the
// daemon would.
func (h *Host) crash() {
	h.stop()
	<-h.done
}

// Crash is crash, for the package's external tests: a host "killed -9".
func (h *Host) Crash() { h.crash() }

// SetBeforeClaim runs f between a change's routing and its status
// transaction.
func (r *Router) SetBeforeClaim(f func(name string)) { r.beforeClaim = f }
