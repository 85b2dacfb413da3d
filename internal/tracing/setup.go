package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Setup reads the OpenTelemetry switches of environ, the process'
// environment as a map, and starts exporting traces when they ask for it:
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT set,
// or OTEL_TRACES_EXPORTER=otlp (to the SDK's default endpoint). It
// returns a nil Tracer, and a shutdown that does nothing, when they do
// not, when OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is none.
//
// It checks what the SDK would otherwise pass over with a line on
// stderr (the protocol, the endpoints, the sampler) and returns an error
// naming the variable. The rest of the OTEL_* variables (headers,
// timeouts, certificates, compression, the batch processor's, the
// resource's) are read by the SDK itself, from the process' environment.
// Export failures are logged by log, at warn. shutdown flushes the spans
// not yet exported; call it once the last request ended.
func Setup(ctx context.Context, environ map[string]string, version string, log *slog.Logger) (t *Tracer, shutdown func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	grpc, on, err := exporting(environ)
	if err != nil || !on {
		return nil, none, err
	}
	var exp sdktrace.SpanExporter
	if grpc {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, none, fmt.Errorf("OTEL_EXPORTER_OTLP_*: %w", err)
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// over the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "llmproxy"), attribute.String("service.version", version)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, none, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("traces: the OpenTelemetry SDK reports an error", "err", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	protocol := "http/protobuf"
	if grpc {
		protocol = "grpc"
	}
	log.Info("exporting traces over OTLP", "protocol", protocol, "endpoint", endpoint(environ))
	return New(tp), tp.Shutdown, nil
}

// endpoint is where the traces go, as the log line shows it: the traces
// endpoint, else the general one, without a password.
func endpoint(environ map[string]string) string {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if u, err := url.Parse(strings.TrimSpace(environ[name])); err == nil && u.Host != "" {
			return u.Redacted()
		}
	}
	return "the SDK's default (localhost)"
}

// exporting reads whether traces are exported, and over gRPC rather than
// OTLP/HTTP; err names the first variable that is set wrong.
func exporting(environ map[string]string) (grpc, on bool, err error) {
	get := func(name string) string { return strings.TrimSpace(environ[name]) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false, false, nil
	}
	switch exporter := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exporter {
	case "none":
		return false, false, nil
	case "otlp":
		on = true
	case "":
	default:
		return false, false, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported: use otlp or none", exporter)
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := get(name); v != "" {
			u, perr := url.Parse(v)
			if perr != nil {
				// The parser's error quotes the whole value, password and all.
				return false, false, fmt.Errorf("%s: not a URL (the value is not shown: it may hold a password)", name)
			}
			if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return false, false, fmt.Errorf("%s: %q is not an http:// or https:// URL with a host", name, u.Redacted())
			}
			on = true
		}
	}
	if !on {
		return false, false, nil
	}
	protocol, name := get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if protocol == "" {
		protocol, name = get("OTEL_EXPORTER_OTLP_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch protocol {
	case "grpc":
		grpc = true
	case "", "http/protobuf":
	default:
		return false, false, fmt.Errorf("%s: %q is not supported: use http/protobuf or grpc", name, protocol)
	}
	return grpc, true, checkSampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
}

// checkSampler reports what is wrong with a sampler the SDK is asked
// for: a name it does not know, or a ratio that is not a number from 0
// to 1.
func checkSampler(sampler, arg string) error {
	switch strings.ToLower(sampler) {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return nil
	case "traceidratio", "parentbased_traceidratio":
		if arg == "" {
			return nil
		}
		if r, err := strconv.ParseFloat(arg, 64); err != nil || !(r >= 0 && r <= 1) {
			return fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio from 0 to 1", arg)
		}
		return nil
	}
	return fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not supported: use always_on, always_off, traceidratio or their parentbased_ forms", sampler)
}
