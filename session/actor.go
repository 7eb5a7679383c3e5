package session

import "context"

type actorKey struct{}

// WithActor returns a context that says who is making calls with it: "cli",
// "tui", "ssh:<key comment>". The Service records it as Execution.By and
// Event.By. Only the caller's identity rides in a context; everything else
// is an argument.
func WithActor(ctx context.Context, who string) context.Context {
	return context.WithValue(ctx, actorKey{}, who)
}

// Actor returns who is making calls with ctx, or "" when nobody said.
func Actor(ctx context.Context) string {
	who, _ := ctx.Value(actorKey{}).(string)
	return who
}
