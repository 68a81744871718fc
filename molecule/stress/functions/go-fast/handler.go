package function

import "context"

func factorial(n uint64) uint64 {
	if n < 2 {
		return 1
	}
	return n * factorial(n-1)
}

func fib(n int) int {
	a, b := 0, 1
	for i := 0; i < n; i++ {
		a, b = b, a+b
	}
	return a
}

// Handle computes factorial(20) and fib(20): no dependencies, no I/O.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	return map[string]any{"factorial20": factorial(20), "fib20": fib(20)}, nil
}
