package sim

import "net/http"

// PLACEHOLDER, replaced by the OpenAI server.
type workerMetrics struct{}

func newWorkerMetrics(w *Worker) *workerMetrics     { return &workerMetrics{} }
func (m *workerMetrics) published(n int, err error) {}
func (w *Worker) handler() http.Handler             { return http.NewServeMux() }
