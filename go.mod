module github.com/llmproxy/llmproxy

go 1.26.8

require (
	github.com/caarlos0/env/v11 v11.4.2 // indirect
	github.com/go-chi/chi/v5 v5.5.0 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
)
