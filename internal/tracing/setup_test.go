package tracing

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmproxy/llmproxy/internal/otlptest"
)

func TestExportingReadsTheSwitches(t *testing.T) {
	const ep = "http://127.0.0.1:4318"
	for _, tc := range []struct {
		name     string
		env      map[string]string
		on, grpc bool
		bad      string // the variable the error names; "" = no error
	}{
		{"nothing set", nil, false, false, ""},
		{"an endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep}, true, false, ""},
		{"an https endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example:4318"}, true, false, ""},
		{"an endpoint of another scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector.example"}, false, false, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"a traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ep + "/v1/traces"}, true, false, ""},
		{"the otlp exporter alone", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, false, ""},
		{"the otlp exporter in capitals", map[string]string{"OTEL_TRACES_EXPORTER": " OTLP "}, true, false, ""},
		{"the none exporter", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_TRACES_EXPORTER": "none"}, false, false, ""},
		{"the SDK disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_SDK_DISABLED": "TRUE"}, false, false, ""},
		{"the SDK not disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_SDK_DISABLED": "false"}, true, false, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, true, ""},
		{"grpc for traces over http in general", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep,
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, true, true, ""},
		{"http for traces over grpc in general", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep,
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true, false, ""},
		{"a bad protocol is not read while off", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, false, false, ""},
		{"http/json", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"a bad traces protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, false, false, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{"another exporter", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_TRACES_EXPORTER": "zipkin"}, false, false, "OTEL_TRACES_EXPORTER"},
		{"an endpoint without a scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4318"}, false, false, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"an endpoint without a host", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http:///v1"}, false, false, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"a traces endpoint that is no URL", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1"}, false, false, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{"a ratio sampler", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, true, false, ""},
		{"a bad sampler", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_TRACES_SAMPLER": "sometimes"}, false, false, "OTEL_TRACES_SAMPLER"},
		{"a ratio above 1", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": ep, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, false, false, "OTEL_TRACES_SAMPLER_ARG"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grpc, on, err := exporting(tc.env)
			switch {
			case tc.bad != "":
				if err == nil || !strings.HasPrefix(err.Error(), tc.bad+": ") {
					t.Fatalf("err %v, want one naming %s", err, tc.bad)
				}
			case err != nil:
				t.Fatalf("err %v", err)
			case on != tc.on || grpc != tc.grpc:
				t.Fatalf("on %v, grpc %v; want %v, %v", on, grpc, tc.on, tc.grpc)
			}
		})
	}
}

func TestCheckSampler(t *testing.T) {
	for _, tc := range []struct {
		sampler, arg string
		ok           bool
	}{
		{"", "", true}, {"always_on", "", true}, {"ALWAYS_OFF", "", true}, {"parentbased_always_on", "", true},
		{"parentbased_always_off", "", true}, {"traceidratio", "", true}, {"traceidratio", "0", true}, {"traceidratio", "1", true},
		{"parentbased_traceidratio", "0.5", true}, {"traceidratio", "-0.1", false}, {"traceidratio", "1.0001", false},
		{"traceidratio", "NaN", false}, {"traceidratio", "half", false}, {"jaeger_remote", "", false}, {"xray", "", false},
	} {
		if err := checkSampler(tc.sampler, tc.arg); (err == nil) != tc.ok {
			t.Errorf("checkSampler(%q, %q) = %v, want ok %v", tc.sampler, tc.arg, err, tc.ok)
		}
	}
}

// TestSetupIsOffUnlessAsked: without an endpoint Setup makes no Tracer,
// and its shutdown does nothing; a bad variable is its error.
func TestSetupIsOffUnlessAsked(t *testing.T) {
	tr, shutdown, err := Setup(context.Background(), map[string]string{"OTEL_SERVICE_NAME": "x"}, "v", quiet())
	if err != nil || tr != nil {
		t.Fatalf("Setup = %v, %v; want no Tracer", tr, err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, _, err = Setup(context.Background(), map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "v", quiet())
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Fatalf("Setup with a bad endpoint: %v, want an error naming it", err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestSetupExportsOverEitherProtocolAndFlushesAtShutdown: with the
// standard variables set (in the process' environment, where the SDK
// reads them), Setup's spans reach a receiver over OTLP/HTTP and over
// gRPC, named by OTEL_SERVICE_NAME, or llmproxy by default, with the
// version; a batch delay of a minute leaves them to the shutdown's
// flush.
func TestSetupExportsOverEitherProtocolAndFlushesAtShutdown(t *testing.T) {
	for _, tc := range []struct {
		protocol, service, wantService string
	}{
		{"http/protobuf", "", "llmproxy"},
		{"grpc", "eval-proxy", "eval-proxy"},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			rcv := otlptest.Start(t)
			if tc.protocol == "grpc" {
				rcv = otlptest.StartGRPC(t)
			}
			env := map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.URL(),
				"OTEL_EXPORTER_OTLP_PROTOCOL": tc.protocol,
				"OTEL_BSP_SCHEDULE_DELAY":     "60000",
				"OTEL_SERVICE_NAME":           tc.service,
			}
			for k, v := range env {
				t.Setenv(k, v)
			}
			tr, shutdown, err := Setup(context.Background(), env, "v1.2.3", quiet())
			if err != nil || tr == nil {
				t.Fatalf("Setup = %v, %v", tr, err)
			}
			rq := tr.Start(httptest.NewRequest("POST", "/v1/chat/completions", nil), "", "req-setup")
			rq.End(200, "ok", 0, "")
			time.Sleep(50 * time.Millisecond)
			if n := len(rcv.Spans()); n != 0 {
				t.Fatalf("%d spans exported before the batch delay or the shutdown", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans := rcv.Spans()
			if len(spans) != 1 || spans[0].Name != "POST /*" || spans[0].Attrs["llmproxy.request_id"] != "req-setup" {
				t.Fatalf("received %+v, want the request's span", spans)
			}
			res := spans[0].Resource
			if res["service.name"] != tc.wantService || res["service.version"] != "v1.2.3" || spans[0].Scope != scope {
				t.Errorf("resource %v, scope %q; want service %s v1.2.3 and scope %s", res, spans[0].Scope, tc.wantService, scope)
			}
		})
	}
}

// TestEndpointAsLogged: the log line names the traces endpoint before the
// general one, a URL with a host only, without its password.
func TestEndpointAsLogged(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": " https://t:443/v1/traces "}, "https://t:443/v1/traces"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://u:secret@c:4318"}, "https://u:xxxxx@c:4318"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "/v1/traces"}, "the SDK's default (localhost)"},
		{nil, "the SDK's default (localhost)"},
	} {
		if got := endpoint(tc.env); got != tc.want {
			t.Errorf("endpoint(%v) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

// TestABadEndpointsPasswordIsNotShown: the start-up error for an
// endpoint that is no URL, or one of another scheme, does not show the
// password in its user info.
func TestABadEndpointsPasswordIsNotShown(t *testing.T) {
	const pw = "Sekr1t-otlp-9f2"
	for _, v := range []string{
		"http://collector:" + pw + "@[::1",          // no URL: the parser's error quotes it
		"http://collector:" + pw + "@host:4318/%zz", // a bad escape
		"http://collector:" + pw + "@host:port",     // a bad port
		"ftp://collector:" + pw + "@collector:4318", // another scheme
		"http://collector:" + pw + "@/v1/traces",    // no host
	} {
		for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
			_, _, err := exporting(map[string]string{name: v})
			if err == nil || strings.Contains(err.Error(), pw) || !strings.HasPrefix(err.Error(), name+": ") {
				t.Errorf("%s=%q: %v, want an error naming the variable and not the password", name, v, err)
			}
		}
	}
}
