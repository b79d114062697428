// What %nsmid reads on this device beside its SM count (split_kv.cu's RG_DEEP_PERSIST shares
// %nsmid x CTAs-an-SM slots out over a grid's (sequence, head)s; PTX allows %nsmid past the
// SMs there are, which would leave some persistent CTAs waiting for a slot).
//   nvcc -arch=sm_90 -o nsmid benchmarks/probes/nsmid.cu && ./nsmid
#include <cstdio>

__global__ void nsmid(unsigned* out) { asm volatile("mov.u32 %0, %%nsmid;" : "=r"(out[0])); }

int main() {
  unsigned* d = nullptr;
  unsigned h = 0;
  int sms = 0;
  if (cudaMalloc(&d, sizeof h) != cudaSuccess) return 1;
  nsmid<<<1, 1>>>(d);
  if (cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::printf("nsmid %u sm_count %d\n", h, sms);
  return h == (unsigned)sms ? 0 : 2;
}
