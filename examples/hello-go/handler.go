package function

import (
	"context"
	"fmt"
)

// Handle greets whoever the event names.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	name, _ := event["name"].(string)
	if q, ok := event["_query"].(map[string]any); ok && name == "" {
		name, _ = q["name"].(string)
	}
	if name == "" {
		name = "world"
	}
	return map[string]any{"message": fmt.Sprintf("Hello, %s!", name), "runtime": "go1.23"}, nil
}
