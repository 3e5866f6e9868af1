export const api = { fetchApi: (route, options) => fetch("/api" + route, options) };
