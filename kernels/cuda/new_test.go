//go:build !cuda

package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
)

func TestNewWithoutCUDATag(t *testing.T) {
	b, err := cuda.New(cuda.Config{})
	require.ErrorIs(t, err, kernels.ErrNoDevice)
	require.Nil(t, b)
}
