//! gRPC contracts (kubelet device plugin v1beta1, podresources v1, manager API). Filled by issues 5 and 6.
