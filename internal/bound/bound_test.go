package bound_test

import (
	"fmt"
	"strings"

	"github.com/llmproxy/llmproxy/internal/bound"
)

func ExampleField() {
	fmt.Println(bound.Field("gpt-4o-mini"))
	long := bound.Field(strings.Repeat("m", 1<<20))
	fmt.Println(len(long), long[60:])
	// Output:
	// gpt-4o-mini
	// 83 mmmm…a00d1a356de13b72
}
