package proxy

import (
	"net/http"
	"net/url"
	"strings"
)

// credential returns the first credential the request carries, in the
// places the big providers take one: Authorization (OpenAI's Bearer, and
// any other scheme whole), x-api-key (Anthropic), api-key (Azure OpenAI),
// x-goog-api-key and the key query parameter (Gemini's own API). Requests
// with different keys never share a lane.
func credential(h http.Header, rawQuery string) string {
	if v := h.Get("Authorization"); v != "" {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:])
		}
		if id, ok := sigV4Credential(v); ok {
			return id
		}
		return v
	}
	for _, k := range []string{"X-Api-Key", "Api-Key", "X-Goog-Api-Key"} {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return queryKey(rawQuery)
}

// sigV4Credential is what names the signer of an AWS Signature Version 4
// Authorization (Amazon Bedrock's own API): the access key ID, region and
// service of its Credential=, never the date or the signature, which
// change from request to request. ok is false for any other scheme, or a
// Credential= that does not have its five parts.
func sigV4Credential(auth string) (string, bool) {
	const scheme = "AWS4-HMAC-SHA256 "
	if len(auth) <= len(scheme) || !strings.EqualFold(auth[:len(scheme)], scheme) {
		return "", false
	}
	for _, part := range strings.Split(auth[len(scheme):], ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(part), "=")
		if name != "Credential" {
			continue
		}
		// AKID/yyyymmdd/region/service/aws4_request
		f := strings.Split(value, "/")
		if len(f) != 5 || f[0] == "" || f[4] != "aws4_request" {
			return "", false
		}
		return "sigv4 " + f[0] + "/" + f[2] + "/" + f[3], true
	}
	return "", false
}

// queryKey is the first key parameter of a raw query, unescaped when it
// can be; a value that does not unescape is still a distinct key.
func queryKey(rawQuery string) string {
	for rawQuery != "" {
		var part string
		part, rawQuery, _ = strings.Cut(rawQuery, "&")
		name, value, _ := strings.Cut(part, "=")
		if name != "key" || value == "" {
			continue
		}
		if v, err := url.QueryUnescape(value); err == nil {
			return v
		}
		return value
	}
	return ""
}
