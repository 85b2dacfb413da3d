package tracing

import (
	"net/url"
	"strings"
)

// ProviderName is the gen_ai.provider.name of a route's requests: the
// well-known name (OpenTelemetry's semantic conventions) of the provider
// whose API its upstream's host is, else of the provider its name names
// (anthropic, azure, bedrock, gemini, …); "" when neither tells.
func ProviderName(route string, upstream *url.URL) string {
	if upstream != nil {
		host := strings.ToLower(upstream.Hostname())
		if strings.HasPrefix(host, "bedrock-runtime.") && strings.HasSuffix(host, ".amazonaws.com") {
			return "aws.bedrock" // bedrock-runtime.<region>.amazonaws.com
		}
		for _, p := range providerHosts {
			if host == p.host || p.suffix && strings.HasSuffix(host, p.host) {
				return p.name
			}
		}
	}
	return providerRoutes[strings.ToLower(route)]
}

// providerHosts are the providers' API hosts; a suffix matches the end
// of a host (a resource's or a region's name comes before it).
var providerHosts = []struct {
	host   string
	suffix bool
	name   string
}{
	{"api.openai.com", false, "openai"},
	{".openai.azure.com", true, "azure.ai.openai"},
	{".services.ai.azure.com", true, "azure.ai.inference"},
	{".inference.ai.azure.com", true, "azure.ai.inference"},
	{"api.anthropic.com", false, "anthropic"},
	{"generativelanguage.googleapis.com", false, "gcp.gemini"},
	{"aiplatform.googleapis.com", true, "gcp.vertex_ai"},
	{"api.mistral.ai", false, "mistral_ai"},
	{"api.groq.com", false, "groq"},
	{"api.deepseek.com", false, "deepseek"},
	{"api.x.ai", false, "x_ai"},
	{"api.perplexity.ai", false, "perplexity"},
	{"api.cohere.com", false, "cohere"},
	{"api.cohere.ai", false, "cohere"},
}

// providerRoutes are the route names that name a provider.
var providerRoutes = map[string]string{
	"openai": "openai", "anthropic": "anthropic", "azure": "azure.ai.openai",
	"bedrock": "aws.bedrock", "gemini": "gcp.gemini", "vertex": "gcp.vertex_ai",
	"mistral": "mistral_ai", "groq": "groq", "deepseek": "deepseek", "xai": "x_ai",
	"perplexity": "perplexity", "cohere": "cohere",
}

// Operation is the gen_ai.operation.name of a request to path, by the
// endpoint its path ends in: chat (OpenAI's chat completions and
// responses, Anthropic's messages), text_completion, embeddings,
// generate_content (Gemini's own API); "" for any other endpoint.
func Operation(path string) string {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"), strings.HasSuffix(path, "/responses"), strings.HasSuffix(path, "/v1/messages"):
		return "chat"
	case strings.HasSuffix(path, "/completions"):
		return "text_completion"
	case strings.HasSuffix(path, "/embeddings"):
		return "embeddings"
	case strings.HasSuffix(path, ":generateContent"), strings.HasSuffix(path, ":streamGenerateContent"):
		return "generate_content"
	}
	return ""
}
