package function

import (
	"context"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func number(event map[string]any, key string, fallback float64) float64 {
	if v, ok := event[key].(float64); ok && v > 0 {
		return v
	}
	return fallback
}

// Handle runs event["workers"] goroutines (default 20) for event["duration_sec"] seconds (default
// 60) against PostgreSQL ($DATABASE_URL): INSERT, SELECT count, SELECT max in turn, with a random
// pause of up to event["max_delay_ms"] (default 100) between operations.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	workers := int(number(event, "workers", 20))
	duration := time.Duration(number(event, "duration_sec", 60) * float64(time.Second))
	maxDelay := int(number(event, "max_delay_ms", 100))
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS stress_storm (id bigserial PRIMARY KEY, worker int, at timestamptz DEFAULT now())"); err != nil {
		return nil, err
	}
	var ok, bad atomic.Int64
	var lastErr atomic.Value
	start := time.Now()
	deadline := start.Add(duration)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(worker int) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				var err error
				switch i % 3 {
				case 0:
					_, err = pool.Exec(ctx, "INSERT INTO stress_storm (worker) VALUES ($1)", worker)
				case 1:
					var n int64
					err = pool.QueryRow(ctx, "SELECT count(*) FROM stress_storm").Scan(&n)
				default:
					var m *int64
					err = pool.QueryRow(ctx, "SELECT max(id) FROM stress_storm").Scan(&m)
				}
				if err != nil {
					bad.Add(1)
					lastErr.Store(err.Error())
				} else {
					ok.Add(1)
				}
				if maxDelay > 0 {
					time.Sleep(time.Duration(rand.Intn(maxDelay)) * time.Millisecond)
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	total := ok.Load() + bad.Load()
	result := map[string]any{"workers": workers, "duration_sec": duration.Seconds(), "elapsed_sec": elapsed,
		"total_ops": total, "ok_ops": ok.Load(), "err_ops": bad.Load(), "ops_per_sec": float64(total) / elapsed}
	if e, ok := lastErr.Load().(string); ok {
		result["last_error"] = e
	}
	return result, nil
}
