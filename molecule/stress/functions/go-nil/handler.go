package function

import "context"

type thing struct{ name string }

// Handle dereferences a nil pointer unless event["crash"] is false: a Go panic on purpose.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	var t *thing
	if crash, ok := event["crash"].(bool); ok && !crash {
		t = &thing{name: "fine"}
	}
	return map[string]any{"name": t.name}, nil
}
