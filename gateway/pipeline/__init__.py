"""The data flow of one chat request, one module per step; imports no third-party SDKs."""
