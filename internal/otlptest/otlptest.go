// Package otlptest is an OpenTelemetry collector's trace receiver for
// tests: a server on a free loopback port that takes OTLP exports as an
// exporter sends them to a collector, Jaeger or Tempo, and keeps the
// spans it decodes: over HTTP (Start: POST /v1/traces, the collector's
// ExportTraceServiceRequest in protobuf, gzipped or not) or gRPC
// (StartGRPC: the collector's TraceService). It does no more of a
// collector's work: no other signal, no JSON encoding.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one span as the receiver decoded it.
type Span struct {
	TraceID, SpanID string // hex
	ParentID        string // hex; "" for a root span
	Name            string
	Kind            tracepb.Span_SpanKind
	Start, End      time.Time
	// Attrs are its attributes, each value in its string form: a string
	// as it is, a number or a bool as Go formats it, an array as
	// ["a","b"].
	Attrs map[string]string
	// StatusError: the span's status is an error; StatusMessage says why.
	StatusError   bool
	StatusMessage string
	// Resource is its resource's attributes, in the same form; Scope its
	// instrumentation scope's name.
	Resource map[string]string
	Scope    string
}

// Receiver is a running receiver.
type Receiver struct {
	url string

	mu      sync.Mutex
	spans   []Span
	bodies  [][]byte // each export as it came, unzipped
	arrived chan struct{}
}

// Start starts an OTLP/HTTP receiver on 127.0.0.1; it stops when the
// test ends.
func Start(tb testing.TB) *Receiver {
	r := &Receiver{arrived: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(r.export))
	tb.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// StartGRPC starts an OTLP/gRPC receiver on 127.0.0.1, without TLS; it
// stops when the test ends.
func StartGRPC(tb testing.TB) *Receiver {
	tb.Helper()
	r := &Receiver{arrived: make(chan struct{}, 1)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, grpcService{r: r})
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(srv.Stop)
	r.url = "http://" + ln.Addr().String()
	return r
}

// grpcService is the receiver's TraceService.
type grpcService struct {
	collectortrace.UnimplementedTraceServiceServer
	r *Receiver
}

func (g grpcService) Export(_ context.Context, export *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	raw, err := proto.Marshal(export)
	if err != nil {
		return nil, err
	}
	g.r.keep(decode(export), raw)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT
// (an HTTP exporter adds /v1/traces).
func (r *Receiver) URL() string { return r.url }

// keep adds an export's spans, and the export as it came.
func (r *Receiver) keep(spans []Span, raw []byte) {
	r.mu.Lock()
	r.spans = append(r.spans, spans...)
	r.bodies = append(r.bodies, raw)
	r.mu.Unlock()
	select {
	case r.arrived <- struct{}{}:
	default:
	}
}

// export takes one export, as a collector's OTLP/HTTP receiver does.
func (r *Receiver) export(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "only POST /v1/traces", http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "only application/x-protobuf, not "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	var export collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &export)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.keep(decode(&export), raw)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// decode flattens an export into its spans.
func decode(export *collectortrace.ExportTraceServiceRequest) []Span {
	var out []Span
	for _, rs := range export.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs:       attrs(s.GetAttributes()),
					StatusError: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR, StatusMessage: s.GetStatus().GetMessage(),
					Resource: res, Scope: ss.GetScope().GetName(),
				}
				out = append(out, sp)
			}
		}
	}
	return out
}

// attrs is kvs by key, each value in its string form.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = valueString(kv.GetValue())
	}
	return m
}

func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_ArrayValue:
		items := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, item := range x.ArrayValue.GetValues() {
			items = append(items, strconv.Quote(valueString(item)))
		}
		return "[" + strings.Join(items, ",") + "]"
	case *commonpb.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	}
	return fmt.Sprint(v)
}

// Spans is every span received so far, in the order they came.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Contains reports whether any export received so far holds s anywhere
// in its bytes: a span's, an attribute's or the resource's.
func (r *Receiver) Contains(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bodies {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// WaitFor waits up to timeout until done holds for the spans received,
// and returns them; the test fails when it never does.
func (r *Receiver) WaitFor(tb testing.TB, timeout time.Duration, done func([]Span) bool) []Span {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		spans := r.Spans()
		if done(spans) {
			return spans
		}
		select {
		case <-r.arrived:
		case <-deadline.C:
			tb.Fatalf("otlptest: after %v the receiver holds %d spans, not the ones awaited", timeout, len(spans))
			return nil
		}
	}
}
